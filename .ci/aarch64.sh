#!/usr/bin/env bash
# The aarch64 extension, cross-built on x86-64 and run under qemu-user:
#   1. the tools (gcc-aarch64-linux-gnu, qemu-user, debootstrap), apt-get
#      installed where missing;
#   2. an arm64 Debian (bookworm: python3, python3-dev, libgomp1) unpacked by
#      `debootstrap --foreign` (its packages extracted, no second stage: nothing
#      of it runs but python3 under qemu), and aarch64 wheels of numpy, scipy,
#      ml_dtypes, pytest, hypothesis pip-installed into a --target folder; both
#      cached in $FASTATTN_AARCH64_CACHE (default ${TMPDIR:-/tmp}/fastattn-aarch64);
#   3. the extension cross-compiled by setup.py (_PYTHON_HOST_PLATFORM: it
#      builds the generic and neon lines; the target's sysconfigdata for the
#      extension suffix; CC=aarch64-linux-gnu-gcc, the arm64 Python's and
#      NumPy's headers);
#   4. under qemu-aarch64 for each CPU model of $FASTATTN_QEMU_CPUS (default
#      "neoverse-n1 max,sve=off"): a smoke test with FASTATTN_ISA=neon and
#      =generic (every dtype, masks, GQA, decoding, the int8 cache against
#      fastattn.reference), then a numerics subset of the suite (the isa
#      fixture runs it on generic and neon; the larger part on the first CPU);
#      where the model has FEAT_BF16 (max) neon_bf16 is the default path and
#      the smoke test runs on it too (neoverse-n1 has none: neon is chosen);
#   5. bench/bitwise_corpus.py on the neon path, under qemu (the first CPU)
#      and in the SIMDe build of the neon kernels on x86-64
#      (FASTATTN_NEON_EMULATION=simde), compared bitwise by .ci/neon_bitwise.py
#      (which says where the two builds do not run the same instructions);
#      likewise neon_bf16 on the first CPU model that has it.
# Needs root for apt-get and network for the Debian and PyPI downloads the
# first time (then the cache).  Nothing here has run on ARM hardware.
#
#   bash .ci/aarch64.sh
#
# Environment: PYTHON (the build Python, x86-64, with the build requirements
# and fastattn's own dependencies, ml_dtypes included, for the bitwise
# corpus on the SIMDe build: default python), FASTATTN_AARCH64_CACHE, FASTATTN_QEMU_CPUS,
# FASTATTN_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# FASTATTN_SIMDE_INCLUDE (SIMDe >= 0.8.2's include folder; else simde-py is
# pip-installed into the cache and used).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
T0=$SECONDS
step() { printf '\n== [%4ds] %s\n' $((SECONDS - T0)) "$*"; }
CACHE=${FASTATTN_AARCH64_CACHE:-${TMPDIR:-/tmp}/fastattn-aarch64}
ROOT=$CACHE/root          # the arm64 Debian
SITE=$CACHE/site          # the aarch64 wheels
CPUS=${FASTATTN_QEMU_CPUS:-neoverse-n1 max,sve=off}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-aarch64-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE"

step "tools"
need=()
command -v aarch64-linux-gnu-gcc > /dev/null || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 > /dev/null || need+=(qemu-user)
command -v debootstrap > /dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null || {
        echo "missing: ${need[*]} (and no root apt-get to install them)"; exit 1; }
    (apt-get install -y -q "${need[@]}" || { apt-get update -q && apt-get install -y -q "${need[@]}"; }) \
        > "$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log"; exit 1; }
fi
export PATH="$PATH:/usr/sbin"
aarch64-linux-gnu-gcc --version | head -n 1
qemu-aarch64 --version | head -n 1

step "arm64 Python in $ROOT"
if [ ! -f "$ROOT/.unpacked" ]; then
    rm -rf "$ROOT"
    debootstrap --arch=arm64 --foreign --variant=minbase --include=python3,python3-dev,libgomp1 \
        bookworm "$ROOT" "${FASTATTN_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
        > "$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log"; exit 1; }
    # the first stage unpacks only the required packages: every one here
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    touch "$ROOT/.unpacked"
fi
PYVER=$(cd "$ROOT/usr/bin" && ls python3.[0-9]* | grep -E '^python3\.[0-9]+$' | head -n 1)
PYVER=${PYVER#python}                       # 3.11 (bookworm)
APY="$ROOT/usr/bin/python$PYVER"
qemu() { local cpu=$1; shift; qemu-aarch64 -L "$ROOT" -cpu "$cpu" "$@"; }
qemu neoverse-n1 "$APY" -c 'import sys, platform; print(sys.version.split()[0], platform.machine())'

step "aarch64 wheels in $SITE"
if [ ! -f "$SITE/.installed" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --target "$SITE" --only-binary=:all: \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux2014_aarch64 --python-version "$PYVER" --implementation cp \
        --abi "cp${PYVER/./}" numpy scipy ml_dtypes pytest hypothesis threadpoolctl
    touch "$SITE/.installed"
fi

step "cross build (setup.py, CC=aarch64-linux-gnu-gcc)"
read -r -a BUILD_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')"
# (installed where the build Python lacks them)
"$PY" -c 'import Cython, numpy, setuptools' 2> /dev/null \
    || "$PY" -m pip install -q --disable-pip-version-check "${BUILD_REQS[@]}"
SYSCONFIG=$(cd "$ROOT/usr/lib/python$PYVER" && ls _sysconfigdata__aarch64-linux-gnu.py)
mkdir -p "$WORK/sysconfig"
cp "$ROOT/usr/lib/python$PYVER/$SYSCONFIG" "$WORK/sysconfig/"
NPINC=$(echo "$SITE"/numpy/_core/include)
_PYTHON_HOST_PLATFORM=linux-aarch64 _PYTHON_SYSCONFIGDATA_NAME=${SYSCONFIG%.py} \
PYTHONPATH="$WORK/sysconfig" CC=aarch64-linux-gnu-gcc LDSHARED="aarch64-linux-gnu-gcc -shared" \
CFLAGS="-I$NPINC -I$ROOT/usr/include/python$PYVER -I$ROOT/usr/include" LDFLAGS="" \
    "$PY" setup.py -q build --build-base "$WORK/a64" --force > "$WORK/a64.log" 2>&1 \
    || { tail -n 40 "$WORK/a64.log"; exit 1; }
grep "fastattn: building" "$WORK/a64.log"
A64=$(echo "$WORK"/a64/lib.*)
file "$A64"/fastattn/_core*.so | grep -q "ARM aarch64" || { echo "no aarch64 extension in $A64"; exit 1; }

step "SIMDe build of the neon kernels (x86-64), for the bitwise comparison"
if [ -z "${FASTATTN_SIMDE_INCLUDE:-}" ]; then
    [ -f "$CACHE/simde/.installed" ] || {
        "$PY" -m pip install -q --disable-pip-version-check --target "$CACHE/simde" "simde-py>=0.8.2"
        touch "$CACHE/simde/.installed"; }
    FASTATTN_SIMDE_INCLUDE=$(PYTHONPATH="$CACHE/simde" "$PY" -c 'import simde_py; print(simde_py.get_include())')
fi
FASTATTN_SIMDE_INCLUDE=$FASTATTN_SIMDE_INCLUDE FASTATTN_NEON_EMULATION=simde \
    "$PY" setup.py -q build --build-base "$WORK/simde" --force > "$WORK/simde.log" 2>&1 \
    || { tail -n 40 "$WORK/simde.log"; exit 1; }
EMU=$(echo "$WORK"/simde/lib.*)

cat > "$WORK/smoke.py" <<'PYEOF'
"""Every dtype and the main features on the ISA path in use, against the reference."""
import os, numpy as np, ml_dtypes, fastattn
from fastattn import reference
assert fastattn.get_isa() == os.environ["FASTATTN_ISA"], fastattn.get_isa()
print("fastattn", fastattn.__version__, "isa", fastattn.get_isa(), "of", fastattn.available_isas())
rng = np.random.default_rng(7)
tol = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}
for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
    name = np.dtype(dt).name
    for L, S, hq, hk in ((1, 700, 4, 2), (5, 37, 2, 2), (70, 130, 4, 1), (129, 129, 2, 2)):
        q = rng.standard_normal((2, hq, L, 40)).astype(dt)
        k = rng.standard_normal((2, hk, S, 40)).astype(dt)
        v = rng.standard_normal((2, hk, S, 24)).astype(dt)
        mask = rng.random((L, S)) < 0.8
        f64 = [x.astype(np.float64) for x in (q, k, v)]
        for kw in ({}, {"is_causal": "lower_right"}, {"attn_mask": mask}, {"window": (16, 0)},
                   {"softcap": 5.0}):
            got = fastattn.attention(q, k, v, enable_gqa=hq != hk, **kw)
            want = reference.attention(*f64, enable_gqa=hq != hk, **kw)
            err = np.nanmax(np.abs(got.astype(np.float64) - want))
            assert got.dtype == np.dtype(dt) and err < tol[name], (name, L, S, kw, err)
    print(name, "ok")
cache = fastattn.KVCache(1, 2, 32, max_len=64, dtype="int8")
ks, vs = (rng.standard_normal((1, 2, 50, 32)).astype(np.float32) for _ in range(2))
cache.append(ks, vs)
qd = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
out = cache.attend(qd)
kd = cache.keys.astype(np.float64) * cache.key_scales[..., None]
vd = cache.values.astype(np.float64) * cache.value_scales[..., None]
ref = reference.attention(qd.astype(np.float64), kd, vd)
assert np.max(np.abs(out - ref)) < 1e-4, np.max(np.abs(out - ref))
print("int8 cache ok")
PYEOF

# the numerics subset under qemu, on the first CPU model: the suite's named
# cases and shapes, the 16-bit and int8 paths, the vector exp/tanh in ulps,
# determinism across threads; on the others the instructions' own part of it
# (exp/tanh, 16-bit, int8), to stay within a few minutes of CI
SUBSET=(tests/kernels/test_exp_accuracy.py tests/kernels/test_tanh_accuracy.py
        tests/numerics/test_half_attention.py tests/numerics/test_kvcache_int8.py
        tests/kernels/test_neon_bf16.py)
FIRST=(tests/numerics/test_attention_masks.py tests/numerics/test_attention_shapes.py
       tests/numerics/test_softmax.py tests/threads/test_determinism.py)
cd "$WORK"
n=0
BF16_CPU=""   # the first CPU model with FEAT_BF16: neon_bf16 is its default path
for cpu in $CPUS; do
    isas=(neon generic)
    if [ "$(PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -c 'import fastattn; print(fastattn.get_isa())')" = neon_bf16 ]; then
        isas=(neon_bf16 "${isas[@]}")
        BF16_CPU=${BF16_CPU:-$cpu}
    fi
    for isa in "${isas[@]}"; do
        step "qemu -cpu $cpu, FASTATTN_ISA=$isa: smoke test"
        FASTATTN_ISA=$isa PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" "$WORK/smoke.py"
    done
    tests=("${SUBSET[@]}")
    [ $((n++)) -gt 0 ] || tests+=("${FIRST[@]}")
    step "qemu -cpu $cpu: numerics subset (isa fixture: generic, neon): ${tests[*]##*/}"
    FASTATTN_ISA=neon PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -m pytest -q -p no:cacheprovider \
        --rootdir="$REPO" -c "$REPO/pyproject.toml" "${tests[@]/#/$REPO/}"
done

step "bitwise: neon under qemu (-cpu ${CPUS%% *}) vs the SIMDe build on x86-64"
FASTATTN_ISA=neon PYTHONPATH="$A64:$SITE" qemu "${CPUS%% *}" "$APY" "$REPO/bench/bitwise_corpus.py" \
    save "$WORK/qemu.npz" neon
FASTATTN_ISA=neon PYTHONPATH="$EMU" "$PY" "$REPO/bench/bitwise_corpus.py" save "$WORK/simde.npz" neon
"$PY" "$REPO/.ci/neon_bitwise.py" "$WORK/qemu.npz" "$WORK/simde.npz"
if [ -n "$BF16_CPU" ]; then
    step "bitwise: neon_bf16 under qemu (-cpu $BF16_CPU) vs the SIMDe build on x86-64"
    FASTATTN_ISA=neon_bf16 PYTHONPATH="$A64:$SITE" qemu "$BF16_CPU" "$APY" "$REPO/bench/bitwise_corpus.py" \
        save "$WORK/qemu_bf16.npz" neon_bf16
    FASTATTN_ISA=neon_bf16 PYTHONPATH="$EMU" "$PY" "$REPO/bench/bitwise_corpus.py" save "$WORK/simde_bf16.npz" neon_bf16
    "$PY" "$REPO/.ci/neon_bitwise.py" "$WORK/qemu_bf16.npz" "$WORK/simde_bf16.npz"
fi
step "aarch64.sh: all good"

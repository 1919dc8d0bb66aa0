# Sourced (bash) by .ci/aarch64.sh and .ci/build_wheel_aarch64.sh: the cross
# environment for aarch64 on x86-64, set up once and cached.
#   1. the tools (gcc-aarch64-linux-gnu, qemu-user, debootstrap), apt-get
#      installed where missing;
#   2. an arm64 Debian (bookworm: python3, python3-dev, libgomp1) unpacked by
#      `debootstrap --foreign` (its packages extracted, no second stage: nothing
#      of it runs but python3 under qemu), and aarch64 wheels of numpy, scipy,
#      ml_dtypes, pytest, hypothesis pip-installed into a --target folder; both
#      cached in $FASTATTN_AARCH64_CACHE (default ${TMPDIR:-/tmp}/fastattn-aarch64);
#   3. cross_setup_py BUILD_BASE ARGS...: setup.py ARGS with the cross build's
#      environment (_PYTHON_HOST_PLATFORM: it builds the generic and aarch64
#      lines; the target's sysconfigdata for the extension suffix;
#      CC=aarch64-linux-gnu-gcc, the arm64 Python's and NumPy's headers;
#      EXTRA_LDFLAGS appended to the link), its log in BUILD_BASE.log;
#   4. qemu CPU ARGS...: ARGS under qemu-aarch64 -cpu CPU in that Debian.
# Defines REPO, PY, CACHE, ROOT, SITE, PYVER, APY, WORK (removed on exit),
# step.  Needs root for apt-get and network for the Debian and PyPI
# downloads the first time (then the cache).
# Environment: PYTHON (the build Python, x86-64, with the build requirements:
# default python), FASTATTN_AARCH64_CACHE, FASTATTN_DEBIAN_MIRROR (default
# http://deb.debian.org/debian), FASTATTN_AARCH64_FETCH_ONLY (1: steps 1.-2.
# only, then the sourcing script goes on).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
T0=$SECONDS
step() { printf '\n== [%4ds] %s\n' $((SECONDS - T0)) "$*"; }
CACHE=${FASTATTN_AARCH64_CACHE:-${TMPDIR:-/tmp}/fastattn-aarch64}
ROOT=$CACHE/root          # the arm64 Debian
SITE=$CACHE/site          # the aarch64 wheels
MIRROR=${FASTATTN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
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

# unpack_debian SUITE DIR PACKAGES: an arm64 Debian's packages extracted into DIR
unpack_debian() {
    local suite=$1 dir=$2 pkgs=$3
    [ -f "$dir/.unpacked" ] && return 0
    rm -rf "$dir"
    debootstrap --arch=arm64 --foreign --variant=minbase --include="$pkgs" \
        "$suite" "$dir" "$MIRROR" > "$WORK/debootstrap-$suite.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap-$suite.log"; exit 1; }
    # the first stage unpacks only the required packages: every one here
    for deb in "$dir"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$dir"; done
    rm -f "$dir"/var/cache/apt/archives/*.deb
    touch "$dir/.unpacked"
}

step "arm64 Python in $ROOT"
unpack_debian bookworm "$ROOT" python3,python3-dev,libgomp1
PYVER=$(cd "$ROOT/usr/bin" && ls python3.[0-9]* | grep -E '^python3\.[0-9]+$' | head -n 1)
PYVER=${PYVER#python}                       # 3.11 (bookworm)
APY="$ROOT/usr/bin/python$PYVER"
qemu() { local cpu=$1; shift; qemu-aarch64 -L "$ROOT" -cpu "$cpu" "$@"; }
qemu neoverse-n1 "$APY" -c 'import sys, platform; print(sys.version.split()[0], platform.machine())'

step "aarch64 wheels in $SITE"
if [ ! -f "$SITE/.installed" ]; then
    rm -rf "$SITE"   # an interrupted install's leftovers: pip --target would keep them
    "$PY" -m pip install -q --disable-pip-version-check --target "$SITE" --only-binary=:all: \
        --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux2014_aarch64 --python-version "$PYVER" --implementation cp \
        --abi "cp${PYVER/./}" numpy scipy ml_dtypes pytest hypothesis threadpoolctl
    touch "$SITE/.installed"
fi

# FASTATTN_AARCH64_FETCH_ONLY=1 (.ci/run, in the background while the x86-64
# steps run): the downloads above only, nothing built, so no build requirements
if [ "${FASTATTN_AARCH64_FETCH_ONLY:-0}" = 1 ]; then return 0; fi

read -r -a BUILD_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')"
# (installed where the build Python lacks them)
"$PY" -c 'import Cython, numpy, setuptools' 2> /dev/null \
    || "$PY" -m pip install -q --disable-pip-version-check "${BUILD_REQS[@]}"
SYSCONFIG=$(cd "$ROOT/usr/lib/python$PYVER" && ls _sysconfigdata__aarch64-linux-gnu.py)
mkdir -p "$WORK/sysconfig"
cp "$ROOT/usr/lib/python$PYVER/$SYSCONFIG" "$WORK/sysconfig/"
NPINC=$(echo "$SITE"/numpy/_core/include)

cross_setup_py() {
    local base=$1; shift
    _PYTHON_HOST_PLATFORM=linux-aarch64 _PYTHON_SYSCONFIGDATA_NAME=${SYSCONFIG%.py} \
    PYTHONPATH="$WORK/sysconfig" CC=aarch64-linux-gnu-gcc \
    LDSHARED="aarch64-linux-gnu-gcc -shared ${EXTRA_LDFLAGS:-}" \
    CFLAGS="-I$NPINC -I$ROOT/usr/include/python$PYVER -I$ROOT/usr/include" LDFLAGS="" \
        "$PY" setup.py -q "$@" > "$base.log" 2>&1 || { tail -n 40 "$base.log"; exit 1; }
    grep "fastattn: building" "$base.log"
}

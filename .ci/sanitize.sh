#!/usr/bin/env bash
# Build the extension with AddressSanitizer + UndefinedBehaviorSanitizer and
# run the test suite against that build; fail on any sanitizer report.
#
# The build also emulates AVX-512 (setup.py: FASTATTN_AVX512_EMULATION=simde,
# SIMDe from Debian's libsimde-dev, installed here if missing): the
# avx512 kernels run through SIMDe on AVX2, so every test parametrized over
# the ISA paths runs them too -- on a CPU without AVX-512, the only place
# they are ever executed.  The same build emulates the AMX tile and
# AVX512-BF16 instructions in plain C (src_c/simd/bf16_emulate.h), so the amx
# and avx512_bf16 paths (their bfloat16 flash driver, tests/kernels/
# test_amx_*.py) run under the sanitizers on any x86-64 as well.
# FASTATTN_SANITIZE_NO_EMULATION=1 leaves it out.
#
#   bash .ci/sanitize.sh [extra pytest args]
#
# The build goes to a temporary directory (never the checkout's build/ or the
# in-place extension), and is imported from there through PYTHONPATH, with
# the working directory outside the checkout so that the checkout's own
# fastattn cannot shadow it.  The interpreter is not built with ASan, so the
# ASan runtime is preloaded; leak checking is off (CPython keeps memory until
# exit by design).  UBSan is made fatal at compile time
# (-fno-sanitize-recover=all).  Every report is also written to a log file,
# so a report in a child process (tests that spawn python) fails this script
# even if the test that spawned it did not notice.
# Environment: FASTATTN_HYPOTHESIS_PROFILE (default: ci-sanitize when
# tests/conftest.py registers it, else the suite's default profile); CC;
# FASTATTN_TEST_JOBS (pytest-xdist workers, default one per CPU; each worker
# writes its own reports to the log folder).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
T0=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-sanitize.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The build requirements of pyproject.toml (setup.py is run directly below).
read -r -a BUILD_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')"
"$PY" -m pip install -q --disable-pip-version-check "${BUILD_REQS[@]}"

CC=${CC:-gcc}
export CC
# -fno-wrapv: CPython's CFLAGS carry -fwrapv, under which a signed overflow
# is defined and UBSan does not report it (and gcc compiles the instrumented
# kernels far more slowly: this build took 357 s with it, 229 s without, on a
# 2-core AMD Zen 3).
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -fno-wrapv"
if [ "${FASTATTN_SANITIZE_NO_EMULATION:-0}" != 1 ]; then
    if ! echo '#include <simde/x86/avx512.h>' | "$CC" -E -x c - > /dev/null 2>&1; then
        echo "== SIMDe headers missing: apt-get install libsimde-dev"
        if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ]; then
            (apt-get install -y -q libsimde-dev || { apt-get update -q && apt-get install -y -q libsimde-dev; }) \
                > "$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log"; }
        fi
    fi
    echo '#include <simde/x86/avx512.h>' | "$CC" -E -x c - > /dev/null 2>&1 || {
        echo "cannot find <simde/x86/avx512.h> (libsimde-dev); to run without the AVX-512"
        echo "emulation, set FASTATTN_SANITIZE_NO_EMULATION=1"; exit 1; }
    export FASTATTN_AVX512_EMULATION=simde
    # Emulated avx512 under ASan is slow: the default path stays avx2, and the
    # avx512 kernels run in every test parametrized over the ISA paths (the
    # tests whose result depends on the kernels; the rest run once, on avx2).
    export FASTATTN_ISA=avx2
fi
echo "== building with FASTATTN_CFLAGS='$SAN_FLAGS' FASTATTN_AVX512_EMULATION='${FASTATTN_AVX512_EMULATION:-}' into $WORK/build"
# A separate --build-base and --force: nothing is reused from, or written to,
# the checkout's build/ (only cythonize regenerates fastattn/_core.c there,
# with the same contents).
FASTATTN_CFLAGS="$SAN_FLAGS" "$PY" setup.py -q build --build-base "$WORK/build" --force \
    > "$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log"; exit 1; }
LIB=$(echo "$WORK"/build/lib.*)
SO=$(echo "$LIB"/fastattn/_core*.so)
[ -f "$SO" ] || { echo "no extension built under $LIB"; exit 1; }
SYMS=$(nm -D "$SO")    # (not piped into grep -q: SIGPIPE + pipefail)
grep -q '__asan_report' <<< "$SYMS" || { echo "$SO has no ASan instrumentation"; exit 1; }
grep -q '__ubsan_handle' <<< "$SYMS" || { echo "$SO has no UBSan instrumentation"; exit 1; }
echo "built $SO in $((SECONDS - T0)) s"

LIBASAN=$("$CC" -print-file-name=libasan.so)
[ -f "$LIBASAN" ] || { echo "cannot find libasan.so for $CC"; exit 1; }
# libstdc++ is preloaded too: otherwise ASan's __cxa_throw interceptor finds
# no real __cxa_throw and aborts the first time a C++ extension loaded later
# (matplotlib's ft2font, in the plotting tests) throws an exception.
LIBSTDCXX=$("$CC" -print-file-name=libstdc++.so)
PRELOAD=$LIBASAN
[ -f "$LIBSTDCXX" ] && PRELOAD="$PRELOAD:$LIBSTDCXX"
mkdir -p "$WORK/logs"
export LD_PRELOAD="$PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1:log_path=$WORK/logs/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:abort_on_error=1:log_path=$WORK/logs/ubsan"
export PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONFAULTHANDLER=1
if [ -z "${FASTATTN_HYPOTHESIS_PROFILE:-}" ] && grep -q '"ci-sanitize"' tests/conftest.py; then
    export FASTATTN_HYPOTHESIS_PROFILE=ci-sanitize
fi
echo "hypothesis profile: ${FASTATTN_HYPOTHESIS_PROFILE:-(suite default)}"

cd "$WORK"
"$PY" - "$SO" <<'PYEOF'
import os, sys, fastattn, fastattn._core as c
assert c.__file__ == sys.argv[1], f"imported {c.__file__}, not the sanitizer build"
print("importing", c.__file__, "| ISA paths:", fastattn.available_isas(),
      "| avx512 emulated:", c.avx512_emulated())
if os.environ.get("FASTATTN_AVX512_EMULATION"):
    assert c.avx512_emulated() and "avx512" in fastattn.available_isas()
    assert {"avx512_bf16", "amx"} <= set(fastattn.available_isas())
PYEOF
# Left out: the RSS tests (test_no_memory_growth*, *extra_memory*:
# they measure the allocator, and ASan's allocator holds freed memory in
# quarantine and maps shadow memory: nothing of the sanitizers' concern), and
# for the same reason the dask cluster's (its nanny kills a worker past 240
# MiB of RSS, and a worker that has imported fastattn holds ~290 MiB under
# ASan; where distributed is installed: the [test] extra has no dask); the
# tests of the Python tooling: the benchmark harness (tests/cli/test_bench_*),
# the trace printer (tests/cli/test_trace*: NumPy steps, checked against
# fastattn on the walkthrough's few tokens), the module structure (reads the
# sources) and packaging (builds wheels).  They call the kernels only on
# shapes the rest of the suite covers.  All run in the plain pytest step.
# Test paths given as arguments are relative to the checkout (pytest runs
# from $WORK); without any, the whole tests/ folder.
ARGS=()
PATHS=()
for a in "$@"; do
    if [[ "$a" != -* && -e "$REPO/${a%%::*}" ]]; then PATHS+=("$REPO/$a"); else ARGS+=("$a"); fi
done
[ ${#PATHS[@]} -gt 0 ] || PATHS=("$REPO/tests")
# FASTATTN_TEST_JOBS pytest-xdist workers (default: one per CPU); 0 or 1, or
# no pytest-xdist in this Python: the tests run in this process.
JOBS=${FASTATTN_TEST_JOBS:-$(nproc)}
XDIST=()
if [ "$JOBS" -gt 1 ]; then
    if "$PY" -c 'import xdist' 2> /dev/null; then XDIST=(-n "$JOBS"); else echo "(no pytest-xdist: one process)"; fi
fi
# (the workers share the CPUs: an OpenMP thread that waits sleeps, not spins)
[ ${#XDIST[@]} = 0 ] || export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
rc=0
"$PY" -m pytest -q -p no:cacheprovider --rootdir="$REPO" -c "$REPO/pyproject.toml" \
    -k "not test_no_memory_growth and not extra_memory" \
    --ignore-glob="$REPO/tests/cli/test_bench_*.py" --ignore-glob="$REPO/tests/cli/test_trace*.py" \
    --ignore="$REPO/tests/api/test_module_structure.py" --ignore="$REPO/tests/test_packaging.py" \
    --ignore="$REPO/tests/dask_arrays/test_dask_cluster.py" \
    ${XDIST[@]+"${XDIST[@]}"} "${PATHS[@]}" ${ARGS[@]+"${ARGS[@]}"} || rc=$?
cd "$REPO"
if compgen -G "$WORK/logs/*" > /dev/null; then
    echo "== sanitizer reports:"
    for f in "$WORK"/logs/*; do echo "--- $f"; head -n 80 "$f"; done
    rc=1
fi
echo "== sanitize.sh: pytest exit $rc, $((SECONDS - T0)) s in all"
exit $rc

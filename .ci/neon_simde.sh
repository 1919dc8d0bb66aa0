#!/usr/bin/env bash
# The ARM test build on x86-64: the neon kernels compiled through SIMDe
# (setup.py: FASTATTN_NEON_EMULATION=simde; SIMDe >= 0.8.2 from the simde-py
# package, pip-installed into a temporary folder, or FASTATTN_SIMDE_INCLUDE),
# with AVX2 + FMA so that a fused multiply-add rounds as the hardware's FMLA,
# then the suite against it with neon the default path: every test runs the
# neon kernels, those parametrized over the ISA paths neon_bf16's as well
# (FASTATTN_TEST_ISAS, tests/conftest.py: the build's other paths, generic
# and x86's, are compiled as in the plain build, whose step runs them).
#
#   bash .ci/neon_simde.sh [extra pytest args]
#
# The build goes to a temporary directory, or to FASTATTN_NEON_SIMDE_BUILD
# (kept there: .ci/run hands it on to .ci/aarch64.sh's bitwise comparison),
# and is imported from there through PYTHONPATH, from a working directory
# outside the checkout (as sanitize.sh).  The tests run on
# FASTATTN_TEST_JOBS pytest-xdist workers (default: one per CPU; 0: in this
# process), as sanitize.sh.
# Left out: the module-structure and packaging tests (they read the checkout's
# files and build wheels), the benchmark harness (tests/cli/test_bench_*) and
# the trace printer (tests/cli/test_trace*: NumPy steps, checked against
# fastattn on the walkthrough's few tokens, which tests/numerics/
# test_walkthrough.py runs here): Python tooling, run in the plain step.
# Test paths given as arguments are relative to the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
T0=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-neon.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

read -r -a BUILD_REQS <<< "$("$PY" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')"
"$PY" -c 'import Cython, numpy, setuptools' 2> /dev/null \
    || "$PY" -m pip install -q --disable-pip-version-check "${BUILD_REQS[@]}"
if [ -z "${FASTATTN_SIMDE_INCLUDE:-}" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --target "$WORK/simde" "simde-py>=0.8.2"
    FASTATTN_SIMDE_INCLUDE=$(PYTHONPATH="$WORK/simde" "$PY" -c 'import simde_py; print(simde_py.get_include())')
fi
export FASTATTN_SIMDE_INCLUDE
BUILD=${FASTATTN_NEON_SIMDE_BUILD:-$WORK/build}
echo "== building with FASTATTN_NEON_EMULATION=simde (SIMDe: $FASTATTN_SIMDE_INCLUDE) into $BUILD"
FASTATTN_NEON_EMULATION=simde "$PY" setup.py -q build --build-base "$BUILD" --force \
    > "$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log"; exit 1; }
LIB=$(echo "$BUILD"/lib.*)
echo "built in $((SECONDS - T0)) s"

export PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"
export FASTATTN_ISA=neon
FASTATTN_TEST_ISAS=$(cd "$WORK" && "$PY" -c 'import fastattn; print(",".join(n for n in fastattn.available_isas() if n.startswith("neon")))')
export FASTATTN_TEST_ISAS
cd "$WORK"
"$PY" - "$LIB" <<'PYEOF'
import os, sys, fastattn, fastattn._core as c
assert c.__file__.startswith(sys.argv[1]), f"imported {c.__file__}, not the SIMDe build"
assert c.neon_emulated() and fastattn.get_isa() == "neon", (c.neon_emulated(), fastattn.get_isa())
print("importing", c.__file__, "| ISA paths:", fastattn.available_isas(),
      "| the tests' ISA paths:", os.environ["FASTATTN_TEST_ISAS"])
PYEOF
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
    --ignore="$REPO/tests/api/test_module_structure.py" --ignore="$REPO/tests/test_packaging.py" \
    --ignore-glob="$REPO/tests/cli/test_bench_*.py" --ignore-glob="$REPO/tests/cli/test_trace*.py" \
    ${XDIST[@]+"${XDIST[@]}"} "${PATHS[@]}" ${ARGS[@]+"${ARGS[@]}"} || rc=$?
echo "== neon_simde.sh: pytest exit $rc, $((SECONDS - T0)) s in all"
exit $rc

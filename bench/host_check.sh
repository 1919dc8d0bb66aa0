#!/bin/bash
# host_check.sh -- one pass over a borrowed many-core machine (the device
# tool's host, or any CPU this project lacks day to day): what the CPU is,
# the build, the test suite, then the backward and serving sections on the
# thread counts given; each step time-boxed, so one short lease returns
# something from each.  Run from the repository root:
#
#     OUT=/tmp/hc bash bench/host_check.sh              # defaults below
#     TEST_S=90 BW_S=200 SV_S=180 THR=1,2,16 SVTHR=1,2 OUT=$OUT bash bench/host_check.sh
#
# Writes build.log, tests.txt, bw.txt/bw.json and sv.txt/sv.json under $OUT.  The
# eager formula of the backward's score options is left out (it needs
# gigabytes and minutes; its rows come from a machine of one's own).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fastattn-host-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
T0=$SECONDS
st() { echo "== [$((SECONDS - T0))s] $*"; }
st cpu
lscpu | grep -E 'Model name|^CPU\(s\)|Thread\(s\)|Socket|L1d|L2|L3|NUMA node\(s\)'
grep -o -w -E 'amx_tile|amx_bf16|amx_int8|amx_fp16|avx512_bf16|avx512_fp16|avx512f|avx2' /proc/cpuinfo |
    sort | uniq -c
"$PY" -c "import sys, numpy, torch; print(sys.version.split()[0], numpy.__version__, torch.__version__)"
gcc --version | head -1
st build
"$PY" setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
"$PY" -c "import fastattn; print(fastattn.available_isas(), fastattn.get_isa())"
st tests
timeout "${TEST_S:-120}" "$PY" -m pytest -n "$(nproc)" -q -rfE -p no:cacheprovider tests \
    > "$OUT/tests.txt" 2>&1
echo "pytest exit $? (124: cut off by TEST_S)"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20
tail -n 3 "$OUT/tests.txt"                  # the summary, or how far a cut-off run got
st backward
timeout "${BW_S:-240}" "$PY" -m fastattn bench --suite backward --threads "${THR:-1,2,16}" \
    --peers torch --eager-max-gib 0.01 --json "$OUT/bw.json" --no-progress 2>&1 | tee "$OUT/bw.txt"
st serving
timeout "${SV_S:-200}" "$PY" -m fastattn bench --suite serving --serving-rows paged \
    --threads "${SVTHR:-1,2}" --peers torch --json "$OUT/sv.json" --no-progress 2>&1 | tee "$OUT/sv.txt"
st done

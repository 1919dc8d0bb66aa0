#!/usr/bin/env bash
# The aarch64 extension, cross-built on x86-64 and run under qemu-user:
#   1.-3. the cross environment of .ci/aarch64_env.sh (tools, an arm64
#      Debian's Python, aarch64 wheels of the test dependencies, cached), and
#      the extension cross-compiled by setup.py (generic, neon, sve);
#   4. under qemu-aarch64 for each CPU model of $FASTATTN_QEMU_CPUS (default
#      "neoverse-n1 max,sve=off max,sve128=on max,sve256=on"): the default
#      path checked (sve exactly where the vector length is 256 bits, else
#      neon), FASTATTN_ISA forcing each path on the first model that offers
#      it (and refused for sve on every model without it), and
#      .ci/aarch64_smoke.py on each path there too (every dtype, masks, GQA,
#      decoding, the backward pass, the int8 cache, paged caches against
#      fastattn.reference);
#   5. a numerics subset of the suite (the isa fixture's ids chosen by -k): on
#      the first CPU for neon (the parts SIMDe stands in for: the SIMDe build
#      runs the whole suite on the same code), on the first CPU with a 256-bit
#      SVE for sve (a wider subset, and tests/kernels/test_sve.py; part of it
#      in a background lane of its own);
#   6. bench/bitwise_corpus.py on the neon path, under qemu (the first CPU)
#      and in the SIMDe build of the neon kernels on x86-64
#      (FASTATTN_NEON_EMULATION=simde), compared bitwise by .ci/neon_bitwise.py
#      (which says where the two builds do not run the same instructions).
#      SIMDe has no SVE worth the name: the sve tier runs under qemu only.
#      Likewise neon_bf16 (BFMMLA) on the first CPU model that offers it
#      (max: FEAT_BF16; neoverse-n1 has none), after its own subset, on the
#      bfloat16 cases only (its other dtypes run the neon kernels).
#   4.-6. run in two lanes, one per core (each a single-threaded qemu at a
#      time): the bitwise comparisons and the neon subset in the background.
#      The SIMDe build is FASTATTN_NEON_SIMDE_BUILD's where that holds one
#      (.ci/run: .ci/neon_simde.sh's), else built here.
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
# pip-installed into the cache and used), FASTATTN_NEON_SIMDE_BUILD.
source "$(dirname "$0")/aarch64_env.sh"
CPUS=${FASTATTN_QEMU_CPUS:-neoverse-n1 max,sve=off max,sve128=on max,sve256=on}

step "cross build (setup.py, CC=aarch64-linux-gnu-gcc)"
cross_setup_py "$WORK/a64" build --build-base "$WORK/a64" --force
A64=$(echo "$WORK"/a64/lib.*)
file "$A64"/fastattn/_core*.so | grep -q "ARM aarch64" || { echo "no aarch64 extension in $A64"; exit 1; }

step "SIMDe build of the neon kernels (x86-64), for the bitwise comparison"
# .ci/run hands over .ci/neon_simde.sh's build (the same configuration) in
# FASTATTN_NEON_SIMDE_BUILD; without one there, it is built here.
SIMDE_BASE=${FASTATTN_NEON_SIMDE_BUILD:-$WORK/simde}
if compgen -G "$SIMDE_BASE/lib.*/fastattn/_core*.so" > /dev/null; then
    echo "the build in $SIMDE_BASE (FASTATTN_NEON_SIMDE_BUILD)"
else
    if [ -z "${FASTATTN_SIMDE_INCLUDE:-}" ]; then
        [ -f "$CACHE/simde/.installed" ] || {
            "$PY" -m pip install -q --disable-pip-version-check --target "$CACHE/simde" "simde-py>=0.8.2"
            touch "$CACHE/simde/.installed"; }
        FASTATTN_SIMDE_INCLUDE=$(PYTHONPATH="$CACHE/simde" "$PY" -c 'import simde_py; print(simde_py.get_include())')
    fi
    FASTATTN_SIMDE_INCLUDE=$FASTATTN_SIMDE_INCLUDE FASTATTN_NEON_EMULATION=simde \
        "$PY" setup.py -q build --build-base "$SIMDE_BASE" --force > "$WORK/simde.log" 2>&1 \
        || { tail -n 40 "$WORK/simde.log"; exit 1; }
fi
EMU=$(echo "$SIMDE_BASE"/lib.*)
(cd "$WORK" && PYTHONPATH="$EMU" "$PY" - "$EMU" <<'PYEOF'
import sys, fastattn._core as c
assert c.__file__.startswith(sys.argv[1]) and c.neon_emulated(), (c.__file__, "not the SIMDe build")
PYEOF
)

# the path a CPU model's default should be: sve where its vector length is
# 256 bits (qemu-user starts a thread at the model's largest length, at most
# 512 bits: `max` alone would be 512), else neon
expected_default() {
    case "$1" in
        *sve256=on*) echo sve ;;
        max*) echo neon_bf16 ;;      # FEAT_BF16, and no 256-bit SVE
        *) echo neon ;;
    esac
}
# The numerics subset.  sve, which nothing else runs: the suite's named
# cases and shapes, masks and options, the 16-bit and int8 paths, the vector
# exp/tanh in ulps, the backward pass, determinism across threads.  neon (and
# generic): the whole suite runs their code in the SIMDe build (.ci/run's
# step 6), so here only the parts whose instructions SIMDe stands in for.
# (in two halves: SVE_TESTS_LANE in a second background lane from the start,
# the rest in the foreground after the CPU models' checks, so that the
# longest part, sve under qemu, keeps both CPUs busy; the lane's two files
# take ~70% of the sve part's time, about what leaves the three lanes ending
# together on two cores)
SVE_TESTS=(tests/kernels/test_exp_accuracy.py tests/kernels/test_tanh_accuracy.py
           tests/numerics/test_half_attention.py tests/numerics/test_kvcache_int8.py
           tests/numerics/test_attention_masks.py tests/kernels/test_sve.py
           tests/numerics/test_attention_shapes.py)
SVE_TESTS_LANE=(tests/numerics/test_backward.py tests/threads/test_determinism.py)
NEON_TESTS=(tests/kernels/test_exp_accuracy.py tests/kernels/test_tanh_accuracy.py
            tests/numerics/test_half_attention.py tests/numerics/test_kvcache_int8.py
            tests/numerics/test_backward.py)
# neon_bf16: its bfloat16 instructions (pinned to the C emulation) and the
# 16-bit matrix path they run
BF16_TESTS=(tests/kernels/test_neon_bf16.py tests/numerics/test_half_attention.py)
subset() {  # CPU PYTEST-ARGS...
    local cpu=$1; shift
    PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -m pytest -q -p no:cacheprovider \
        --rootdir="$REPO" -c "$REPO/pyproject.toml" "$@"
}
# Each check below is one qemu process, mostly on one thread, so they run in
# two lanes, one per core: the CPU models' checks and the bf16 and sve
# subsets here, the bitwise comparisons and the neon subset in a background
# lane (its output printed when both are done; it fails the script as any
# step does).  First each model's default path and the paths it offers,
# which say where each subset runs.
cd "$WORK"
# (two lanes on two cores: an OpenMP thread that waits sleeps, not spins)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
step "qemu: each CPU model's default path and the paths it offers"
NEON_CPU=${CPUS%% *} BF16_CPU="" SVE_CPU=""
declare -A ISAS_OF
for cpu in $CPUS; do
    want=$(expected_default "$cpu")
    ISAS_OF[$cpu]=$(PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -c \
        'import fastattn; assert fastattn.get_isa() == "'"$want"'", fastattn.get_isa(); print(" ".join(fastattn.available_isas()))')
    echo "qemu -cpu $cpu: default path $want, available: ${ISAS_OF[$cpu]}"
    if [ -z "$BF16_CPU" ] && [[ " ${ISAS_OF[$cpu]} " == *" neon_bf16 "* ]]; then BF16_CPU=$cpu; fi
    if [ -z "$SVE_CPU" ] && [[ " ${ISAS_OF[$cpu]} " == *" sve "* ]]; then SVE_CPU=$cpu; fi
done

bitwise() {  # ISA CPU [CORPUS-ARGS...]: bench/bitwise_corpus.py on ISA under qemu -cpu CPU and in the SIMDe build
    local isa=$1 cpu=$2
    shift 2
    step "bitwise: $isa under qemu (-cpu $cpu) vs the SIMDe build on x86-64${*:+ ($*)}"
    FASTATTN_ISA=$isa PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" "$REPO/bench/bitwise_corpus.py" \
        save "$WORK/qemu_$isa.npz" "$isa" "$@"
    FASTATTN_ISA=$isa PYTHONPATH="$EMU" "$PY" "$REPO/bench/bitwise_corpus.py" save "$WORK/simde_$isa.npz" "$isa" "$@"
    "$PY" "$REPO/.ci/neon_bitwise.py" "$WORK/qemu_$isa.npz" "$WORK/simde_$isa.npz"
}
background_lane() {
    bitwise neon "$NEON_CPU"
    step "qemu -cpu $NEON_CPU: numerics subset on neon (-k neon): ${NEON_TESTS[*]##*/}"
    subset "$NEON_CPU" -k neon "${NEON_TESTS[@]/#/$REPO/}"
    # neon_bf16 runs float32, float64 and float16 on the neon kernels, compared
    # just above: its own instructions (BFMMLA, BFCVT) only in the bfloat16 cases
    if [ -n "$BF16_CPU" ]; then bitwise neon_bf16 "$BF16_CPU" --dtypes bfloat16; fi
}
sve_lane() {
    step "qemu -cpu $SVE_CPU: numerics subset on sve (-k sve): ${SVE_TESTS_LANE[*]##*/}"
    subset "$SVE_CPU" -k sve "${SVE_TESTS_LANE[@]/#/$REPO/}"
}
background_lane > "$WORK/lane.log" 2>&1 &
LANE=$!
SVE_LANE=""
if [ -n "$SVE_CPU" ]; then
    sve_lane > "$WORK/sve_lane.log" 2>&1 &
    SVE_LANE=$!
fi
# (their children first: a killed lane leaves its qemu running otherwise)
# (|| true: errexit holds in the trap, and a lane that is done leaves nothing to kill)
trap 'for l in $LANE $SVE_LANE; do { pkill -P "$l"; kill "$l"; } 2> /dev/null || true; done; rm -rf "$WORK"' EXIT
echo "(background lane: bitwise neon, the neon subset${BF16_CPU:+, bitwise neon_bf16}; pid $LANE)"
[ -z "$SVE_LANE" ] || echo "(second background lane: the sve subset's ${SVE_TESTS_LANE[*]##*/}; pid $SVE_LANE)"

# Each path is forced and smoke-tested on the first model that offers it:
# qemu runs a path's instructions the same way on every model, and what a
# model changes (the paths offered, sve's vector length) is checked per model
# above and by the sve refusal below (the repeats took ~4.5 minutes of this
# lane on a 2-core Zen 3 VM).
declare -A CHECKED
for cpu in $CPUS; do
    isas=""
    for isa in ${ISAS_OF[$cpu]}; do [ -n "${CHECKED[$isa]:-}" ] || isas="$isas $isa"; done
    isas=${isas# }
    for isa in $isas; do CHECKED[$isa]=1; done
    [ -z "$isas" ] || step "qemu -cpu $cpu: FASTATTN_ISA forcing each of $isas"
    for isa in $isas; do
        FASTATTN_ISA=$isa PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -c \
            'import fastattn; assert fastattn.get_isa() == "'"$isa"'", fastattn.get_isa()'
    done
    case " ${ISAS_OF[$cpu]} " in
        *" sve "*) ;;
        *) out=$(FASTATTN_ISA=sve PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" -c 'import fastattn' 2>&1) \
               && { echo "FASTATTN_ISA=sve was accepted on $cpu"; exit 1; }
           grep -q "FASTATTN_ISA=sve: this CPU/OS does not support it" <<< "$out" \
               || { echo "FASTATTN_ISA=sve on $cpu: $out"; exit 1; }
           echo "FASTATTN_ISA=sve refused: ${out##*Error: }" ;;
    esac
    [ -n "$isas" ] || continue
    step "qemu -cpu $cpu: smoke test on each of $isas"
    PYTHONPATH="$A64:$SITE" qemu "$cpu" "$APY" "$REPO/.ci/aarch64_smoke.py" $isas
done
if [ -n "$BF16_CPU" ]; then
    step "qemu -cpu $BF16_CPU: numerics subset on neon_bf16 (-k neon_bf16): ${BF16_TESTS[*]##*/}"
    subset "$BF16_CPU" -k neon_bf16 "${BF16_TESTS[@]/#/$REPO/}"
fi
if [ -n "$SVE_CPU" ]; then
    step "qemu -cpu $SVE_CPU: numerics subset on sve (-k sve): ${SVE_TESTS[*]##*/}"
    subset "$SVE_CPU" -k sve "${SVE_TESTS[@]/#/$REPO/}"
else
    echo "(no CPU model of FASTATTN_QEMU_CPUS has a 256-bit SVE: sve not run)"
fi

wait_lane() {  # PID LOG NAME
    step "waiting for the $3 (pid $1)"
    local rc=0
    wait "$1" || rc=$?
    echo "== the $3's output:"
    cat "$2"
    [ "$rc" = 0 ] || { echo "the $3 exited $rc"; exit 1; }
}
wait_lane "$LANE" "$WORK/lane.log" "background lane"
[ -z "$SVE_LANE" ] || wait_lane "$SVE_LANE" "$WORK/sve_lane.log" "second background lane"
step "aarch64.sh: all good"

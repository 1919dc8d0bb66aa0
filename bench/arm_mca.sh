#!/usr/bin/env bash
# The register-tile loops of Q.K^T and P.V by llvm-mca, per ARM tier and core:
# bench/arm_mca_loops.c (the kernels' own tile, included whole) compiled by
# aarch64-linux-gnu-gcc -O3 -S with each tier's flags (src_c/simd/<tier>.flags,
# as setup.py compiles kernels_isa.c), the inner (k) loop of each function cut
# from the assembly (the backward branch whose body holds the most FMAs), and
# llvm-mca's cycles per iteration on Neoverse N1, N2, V1 and V2, printed per
# k step (one rank-1 update of the MR x NR tile) and as FLOP/cycle against the
# core's FMA peak (float32: 16 FLOP/cycle on N1/N2, 2 x 128-bit pipes; 32 on
# V1/V2, 4 x 128-bit or, V1, 2 x 256-bit SVE; float64 half).  The sve tier is
# compiled for a 256-bit vector length and offered only there: V1 alone (N2 and
# V2 have 128-bit SVE, N1 none).  A model, not a measurement: no ARM hardware.
#
#   bash bench/arm_mca.sh            # markdown rows on stdout
#
# Needs gcc-aarch64-linux-gnu and llvm-mca (Debian: llvm-19; LLVM_MCA=...).
set -euo pipefail
cd "$(dirname "$0")/.."
MCA=${LLVM_MCA:-$(command -v llvm-mca-19 || command -v llvm-mca)}
CC=${CC:-aarch64-linux-gnu-gcc}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-mca.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "<!-- $("$CC" --version | head -n 1); $("$MCA" --version | grep -i 'llvm version' | sed 's/^ *//') -->"
echo "| tier | loop | tile (rows x keys) | k steps / iter | stack accesses / iter | N1 cyc/step | N1 FLOP/cyc | N2 cyc/step | N2 FLOP/cyc | V1 cyc/step | V1 FLOP/cyc | V2 cyc/step | V2 FLOP/cyc |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for tier in generic neon sve; do
    read -r -a flags <<< "$(sed -n 's/^cc://p' "src_c/simd/$tier.flags")"
    "$CC" -O3 -std=c99 -fno-math-errno "${flags[@]}" -DFA_ISA_NAME="$tier" -Isrc_c \
        -S bench/arm_mca_loops.c -o "$WORK/$tier.s"
    python3 - "$WORK" "$tier" "$MCA" <<'PYEOF'
import re, subprocess, sys

work, tier, mca = sys.argv[1:]
asm = open(f"{work}/{tier}.s").read().splitlines()
# the tile shapes, from the .rodata of mca_shape_f32 / _f64
shape = {}
for sfx in ("f32", "f64"):
    i = asm.index(f"mca_shape_{sfx}:")
    shape[sfx] = [int(asm[i + 1 + j].split()[1]) for j in range(4)]
FMA = re.compile(r"^\s*(fmla|fmad|fmadd|fmls|fmsb)\b")
MUL = re.compile(r"^\s*fmul\b")         # the generic tile: a * b + c, not contracted (ISO C)
ADD = re.compile(r"^\s*fadd\b")
CORES = [("neoverse-n1", 16), ("neoverse-n2", 16), ("neoverse-v1", 32), ("neoverse-v2", 32)]


def body(fn):
    lines = asm[asm.index(f"{fn}:"):]
    lines = lines[:next(i for i, l in enumerate(lines) if l.strip().startswith(f".size\t{fn}"))]
    labels = {l[:-1]: i for i, l in enumerate(lines) if re.match(r"^\.L\w+:$", l)}
    best = None
    for i, l in enumerate(lines):
        m = re.match(r"^\s*(b\.?\w*|cbnz|cbz|tbnz|tbz)\s+(?:.*,\s*)?(\.L\w+)$", l)
        if m and labels.get(m.group(2), i) < i:
            loop = [x for x in lines[labels[m.group(2)] + 1:i + 1]
                    if x.startswith("\t") and not x.strip().startswith(".")]
            key = (sum(bool(FMA.match(x) or MUL.match(x)) for x in loop), -len(loop))
            if best is None or key > best[0]:
                best = (key, loop)
    return best[1]


def lanes(ins):
    m = re.search(r"\b[vz]\d+\.(\d*)([sd])\b", ins)
    if not m:
        return 1                                    # scalar fmadd
    if ins.split()[1].startswith("z"):
        return 256 // (32 if m.group(2) == "s" else 64)
    return int(m.group(1))


for sfx in ("f32", "f64"):
    rows_qk, rows_pv, nrv, w = shape[sfx]
    for kind, rows in (("Q.K^T", rows_qk), ("P.V", rows_pv)):
        loop = body(f"mca_{'qk' if kind == 'Q.K^T' else 'pv'}_{sfx}")
        fmas = [x for x in loop if FMA.match(x)]
        muls = [x for x in loop if MUL.match(x)]
        steps = (len(fmas) + len(muls)) / (rows * nrv)
        flop = sum(2 * lanes(x) for x in fmas) + sum(lanes(x) for x in muls) \
            + sum(lanes(x) for x in loop if ADD.match(x))
        spills = sum(1 for x in loop if re.search(r"\[sp", x))
        open(f"{work}/loop.s", "w").write("\n".join(loop) + "\n")
        cells = []
        for cpu, peak in CORES:
            if tier == "sve" and cpu != "neoverse-v1":
                cells += ["—", "—"]
                continue
            out = subprocess.run([mca, "-mtriple=aarch64", f"-mcpu={cpu}", "-iterations=200",
                                  f"{work}/loop.s"], capture_output=True, text=True, check=True).stdout
            cyc = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / 200
            p = peak if sfx == "f32" else peak / 2
            cells += [f"{cyc / steps:.2f}", f"{flop / cyc:.1f} ({100 * flop / cyc / p:.0f}%)"]
        print(f"| {tier} | {kind} {sfx} | {rows} x {nrv * w} | {steps:g} | {spills} | "
              + " | ".join(cells) + " |")
PYEOF
done

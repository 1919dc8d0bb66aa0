#!/usr/bin/env bash
# The neon_bf16 tier's Q.K^T and P.V inner loops by llvm-mca: FLOP per cycle
# against the model's BFMMLA peak, per Neoverse core (bench/README.md,
# "neon_bf16 by llvm-mca").  The steps (kernels/flash16_steps.h) compiled as
# setup.py compiles the tier (-O3 -std=c99 -fno-math-errno and the cc: line
# of src_c/simd/neon_bf16.flags) through bench/arm_mca_bf16.c; each step's
# loop with the most BFMMLA (or BFDOT) is given to llvm-mca.  The peak: the
# model's cycles for independent BFMMLA (32 FLOP each: a 2 x 2 x 4 product).
#
#   bash bench/arm_mca_bf16.sh   (CC, MCA: aarch64-linux-gnu-gcc, llvm-mca-19;
#                                  OPT: the optimisation level, setup.py's -O3)
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-aarch64-linux-gnu-gcc}
MCA=${MCA:-llvm-mca-19}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fastattn-mca.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
read -r -a FLAGS <<< "$(sed -n 's/^cc://p' src_c/simd/neon_bf16.flags)"
"$CC" ${OPT:--O3} -std=c99 -fno-math-errno "${FLAGS[@]}" -DFA_ISA_NAME=neon_bf16 -Isrc_c \
    -S bench/arm_mca_bf16.c -o "$TMP/steps.s"
for i in $(seq 0 23); do echo "bfmmla v$i.4s, v30.8h, v31.8h"; done > "$TMP/peak.s"
"$CC" --version | head -n 1
"$MCA" --version | grep -i "llvm version" || true
python3 - "$TMP" "$MCA" <<'PYEOF'
import re, subprocess, sys
tmp, mca = sys.argv[1:]
asm = open(f"{tmp}/steps.s").read().splitlines()

def function(name):
    """The function's lines, or its tail call's (the step not inlined)."""
    start = asm.index(f"{name}:")
    end = next(i for i in range(start, len(asm)) if asm[i].strip().startswith(".size"))
    code = [a.strip() for a in asm[start + 1:end] if not a.strip().startswith(".")]
    if len(code) == 1 and code[0].startswith("b\t"):
        return function(code[0].split()[1])
    return asm[start:end]

def inner_loop(lines):
    """The backward-branch loop of the function with the most dot products."""
    best = []
    for i, line in enumerate(lines):
        m = re.match(r"\s*b(?:\.\w+)?\s+(\.L\w+)$", line) or re.match(r"\s*b\w*\s+(\.L\w+)$", line)
        if not m or f"{m.group(1)}:" not in lines[:i]:
            continue
        body = lines[lines.index(f"{m.group(1)}:") + 1:i + 1]
        body = [b for b in body if not b.strip().startswith(".")]
        if sum("bfmmla" in b or "bfdot" in b for b in body) > sum("bfmmla" in b or "bfdot" in b for b in best):
            best = body
    return best

def cycles(path, cpu, iters=400):
    out = subprocess.run([mca, "-mtriple=aarch64", f"-mcpu={cpu}", "-mattr=+bf16",
                          f"-iterations={iters}", path], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / iters

loops = {}
for step in ("qk", "pv"):
    body = inner_loop(function(f"mca_{step}_step"))
    path = f"{tmp}/{step}.s"
    open(path, "w").write("\n".join(body) + "\n")
    n_mm = sum("bfmmla" in b for b in body)
    n_dot = sum("bfdot" in b for b in body)
    loops[step] = (path, 32 * n_mm + 16 * n_dot, len(body), n_mm, n_dot)

print("| core | step | instructions / iteration | BFMMLA | cycles / iteration | FLOP / cycle "
      "| BFMMLA peak (FLOP / cycle) | of peak |")
print("|---|---|---|---|---|---|---|---|")
for cpu in ("neoverse-n2", "neoverse-v1", "neoverse-v2"):
    peak = 32 * 24 / cycles(f"{tmp}/peak.s", cpu)
    for step, (path, flop, n, n_mm, n_dot) in loops.items():
        c = cycles(path, cpu)
        print(f"| {cpu} | {'Q.K^T' if step == 'qk' else 'P.V'} | {n} | {n_mm} | {c:.2f} | "
              f"{flop / c:.1f} | {peak:.0f} | {100 * flop / c / peak:.0f}% |")
print("| neoverse-n1 | both | - | - | - | - | no BF16 (FEAT_BF16 is Armv8.6): the neon tier | - |")
PYEOF

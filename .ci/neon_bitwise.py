"""Compare two saves of bench/bitwise_corpus.py on the neon or neon_bf16 path:
the aarch64 build under qemu (A) and the SIMDe build on x86-64 (B).  Run by .ci/aarch64.sh.

    python .ci/neon_bitwise.py A.npz B.npz

Every case must be bitwise identical (NaN compared as NaN: its sign and
payload are each architecture's own, x86 making the default NaN negative and
Arm positive), except where the two builds do not run the same instructions:
  * mha/ cases: their projections are NumPy matmuls, each architecture's BLAS
    (left out);
  * the key-split merge (decoding, and long keys with few query tiles) takes
    the C library's exp2 of double, which glibc computes differently on
    aarch64 and x86-64 (a last-bit difference in about 1 in 1000 arguments):
    within MAX_ULP ulps there, listed.
Exits 1 on any other difference, or on a case missing from either file."""
import sys

import numpy as np

SKIP = ("neon/mha/", "neon_bf16/mha/")


def key_split(name):
    """The corpus's cases whose keys are split and merged: decoding, and the
    long-key attention (two query tiles, 9000 keys)."""
    return name.split("/", 1)[-1].startswith("decode/") or "x9000x" in name


MAX_ULP = 4


def as_float(x):
    """bfloat16 comes back from np.load as 2-byte void: widened to float32 by
    its bits; other arrays unchanged."""
    if x.dtype.kind == "V" and x.dtype.itemsize == 2:
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return x


def ulps(x, y):
    """The largest difference between the finite elements of two float arrays
    of one dtype, in units in the last place of the largest magnitude (inf if
    they differ in being NaN or infinite): the merge's rescaling error is
    relative to the row, not to each output element."""
    if x.dtype.kind != "f":
        return 0 if x.tobytes() == y.tobytes() else np.inf
    nan = np.isnan(x)
    if not np.array_equal(nan, np.isnan(y)) or not np.array_equal(x[np.isinf(x)], y[np.isinf(x)]):
        return np.inf
    ok = np.isfinite(x)
    if not ok.any():
        return 0
    a, b = x[ok], y[ok]
    return float(np.max(np.abs(a - b)) / np.spacing(np.max(np.abs(a))))


def main(pa, pb):
    a, b = np.load(pa), np.load(pb)
    bad = [f"only in {'A' if k in a.files else 'B'}: {k}"
           for k in sorted(set(a.files) ^ set(b.files))]
    same, near, skipped = 0, [], 0
    for k in sorted(set(a.files) & set(b.files)):
        if k.startswith(SKIP):
            skipped += 1
            continue
        x, y = as_float(a[k]), as_float(b[k])
        if x.dtype != y.dtype or x.shape != y.shape:
            bad.append(f"DIFFERS: {k} ({x.dtype}{x.shape} vs {y.dtype}{y.shape})")
            continue
        d = ulps(x, y)
        if d == 0:
            same += 1
        elif key_split(k) and d <= MAX_ULP:
            near.append(f"within {d:.0f} ulp (the merge's libm exp2): {k}")
        else:
            bad.append(f"DIFFERS: {k} ({d} ulp)")
    print("\n".join(near + bad))
    print(f"{same} cases bitwise identical, {len(near)} within {MAX_ULP} ulp in the key-split "
          f"merge, {skipped} left out (NumPy's matmuls), {len(bad)} differing or missing")
    return 1 if bad or not same else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))

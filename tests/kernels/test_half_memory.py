"""16-bit inputs are read in place: at L = S = 8192 float16 (and bfloat16)
the call's extra memory stays within the threads' scratch (<= 16 MiB): no
float32 copy of Q, K or V (6 MiB each) and no L x S matrix."""

from __future__ import annotations

import sys

import pytest

from support import run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self (Linux only)")

_SCRIPT = """
    import sys
    import ml_dtypes, numpy as np, fastattn
    from support import peak_rss_delta

    dt = np.dtype(ml_dtypes.bfloat16) if sys.argv[1] == "bfloat16" else np.dtype(np.float16)
    L = S = 8192
    E = 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, n, E), dtype=np.float32).astype(dt) for n in (L, S, S))
    out = np.full((4, L, E), np.nan, dt)              # touched: resident
    fastattn.attention(q[:, :256], k[:, :512], v[:, :512])   # warm-up: threads, code pages
    extra = peak_rss_delta(lambda: fastattn.attention(q, k, v, out=out, is_causal=True))
    assert np.isfinite(out.astype(np.float32)).all()
    print("EXTRA", extra)
"""


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_streaming_extra_memory_at_8192(dt):
    res = run_python(_SCRIPT, argv=[dt], env={"OMP_NUM_THREADS": None}, timeout=300)
    extra = int([ln for ln in res.stdout.splitlines() if ln.startswith("EXTRA")][0].split()[1])
    assert extra <= 16 * 2**20, f"{dt}: {extra / 2**20:.1f} MiB beyond the resident arrays"

"""16-bit inputs are read in place and the 16-bit matrix driver packs K and V a
key block at a time: a call's extra memory stays within the threads' scratch
(<= 16 MiB), with no float32 copy of Q, K or V, no packed copy of the whole
K and V, and no L x S matrix."""

from __future__ import annotations

import sys

import pytest

import fastattn
from support import run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self (Linux only)")

BOUND = 16 * 2**20

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
    assert extra <= BOUND, f"{dt}: {extra / 2**20:.1f} MiB beyond the resident arrays"


_LONG_KEYS = """
    import sys
    import ml_dtypes, numpy as np, fastattn
    from support import peak_rss_delta

    dt = np.dtype(ml_dtypes.bfloat16) if sys.argv[1] == "bfloat16" else np.dtype(np.float16)
    fastattn.set_isa(sys.argv[2])
    H, L, S, E = 8, 16, 32768, 64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, L, E), dtype=np.float32).astype(dt)
    k, v = (rng.standard_normal((1, H, S, E), dtype=np.float32).astype(dt) for _ in "kv")
    out = np.full((1, H, L, E), np.nan, dt)           # touched: resident
    fastattn.attention(q, k[:, :, :64], v[:, :, :64], out=out)  # warm-up
    extra = peak_rss_delta(lambda: fastattn.attention(q, k, v, out=out))
    assert np.isfinite(out.astype(np.float32)).all()
    print("EXTRA", extra)
"""


@pytest.mark.parametrize("isa", fastattn.available_isas())
@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_half_extra_memory_of_16_queries_against_32768_keys_per_isa(dt, isa):
    """(1, 8, 16, 64) queries against (1, 8, 32768, 64) keys and values, on
    every ISA path: a packed copy of the whole K and V would be 64 MiB."""
    res = run_python(_LONG_KEYS, argv=[dt, isa], env={"OMP_NUM_THREADS": None}, timeout=300)
    extra = int([ln for ln in res.stdout.splitlines() if ln.startswith("EXTRA")][0].split()[1])
    assert extra <= BOUND, f"{dt} on {isa}: {extra / 2**20:.1f} MiB beyond the resident arrays"

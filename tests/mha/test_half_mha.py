"""multi_head_attention on float16 and bfloat16: every step in float32 and
the result rounded once (bitwise the float32 computation on the widened
inputs, rounded: an overflow is inf exactly where that rounding gives it),
and decoding against a 16-bit KVCache read in place by the kernels."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fastattn
from fastattn.mha import KVCache, multi_head_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "numerics"))
from half_common import F32, HALF_IDS, HALVES, assert_bitwise, randn  # noqa: E402

D, H, HKV, DK = 32, 4, 2, 8


def _weights(rng, dt, big=False):
    w = [randn(rng, (D, H * DK), dt, 0.3), randn(rng, (D, HKV * DK), dt, 0.3),
         randn(rng, (D, HKV * DK), dt, 0.3), randn(rng, (H * DK, D), dt, 0.3)]
    if big:  # output column 0 beyond float16's range for most rows (not bfloat16's)
        w[3][:, 0] = 60000.0
    return w


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("big", [False, True], ids=["finite", "overflowing"])
def test_half_mha_rounds_once_at_the_end(rng, dt, big):
    x = randn(rng, (2, 7, D), dt)
    w = _weights(rng, dt, big)
    with np.errstate(over="ignore"):
        got = multi_head_attention(x, *w, H, num_kv_heads=HKV, is_causal=True)
    f32 = multi_head_attention(x.astype(F32), *(a.astype(F32) for a in w), H,
                               num_kv_heads=HKV, is_causal=True)
    assert got.dtype == dt
    with np.errstate(over="ignore"):
        want = f32.astype(dt)
    assert_bitwise(got, want)
    if big and dt == np.float16:
        assert np.isinf(got.astype(np.float64)).any() and np.isfinite(f32).all()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_half_cache_decoding_reads_the_cache_in_place(rng, dt, monkeypatch):
    """Each step equals the float32 computation over the cache's contents
    widened, bitwise; no float32 copy of the cache is made (attention gets
    the 16-bit views themselves)."""
    x = randn(rng, (2, 9, D), dt)
    w = _weights(rng, dt)
    cache = KVCache(2, HKV, DK, max_len=16, dtype=dt)
    seen = []
    real = fastattn._api.attention

    def spy(q, k, v, *a, **kw):
        seen.append((q.dtype, k.dtype, v.dtype, np.shares_memory(k, cache._keys)))
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(fastattn._api, "attention", spy)
    steps = [multi_head_attention(x[:, :5], *w, H, num_kv_heads=HKV, kv_cache=cache)]
    for t in range(5, 9):
        steps.append(multi_head_attention(x[:, t:t + 1], *w, H, num_kv_heads=HKV,
                                          kv_cache=cache))
    assert all(s == (F32, dt, dt, True) for s in seen), seen
    assert len(cache) == 9 and all(s.dtype == dt for s in steps)
    # the last step, recomputed with float32 copies of the cached keys and values
    monkeypatch.setattr(fastattn._api, "attention", real)
    q = (x[:, 8:9].astype(F32) @ w[0].astype(F32)).reshape(2, 1, H, DK).transpose(0, 2, 1, 3)
    heads = fastattn.attention(q, cache.keys.astype(F32), cache.values.astype(F32),
                               is_causal="lower_right", enable_gqa=True)
    merged = heads.transpose(0, 2, 1, 3).reshape(2, 1, H * DK)
    want = (merged @ w[3].astype(F32)).astype(dt)
    assert_bitwise(steps[-1], want)

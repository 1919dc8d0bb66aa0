"""Problems with more than 2**31 scores (64-bit index arithmetic).

``L = S = 47000`` is ``2.2e9 > 2**31`` query/key pairs in one call.  With
``E = Ev = 8`` (and causal masking) that is ~1e10 flops: a few seconds on
two cores.  A handful of output rows are checked against a float64 NumPy
computation of just those rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastattn


BIG = 47000


assert BIG * BIG > 2**31


ROWS = (0, 1, 63, 64, 255, 256, 4097, 23500, 33333, BIG - 65, BIG - 2, BIG - 1)


@pytest.fixture(scope="module")
def big_qkv():
    rng = np.random.default_rng(47000)
    q = rng.standard_normal((BIG, 8)).astype(np.float32)
    k = rng.standard_normal((BIG, 8)).astype(np.float32)
    v = rng.standard_normal((BIG, 8)).astype(np.float32)
    return q, k, v


def _rows64(q, k, v, rows, visible, add=None):
    """float64 attention of the query ``rows``; visible(i) -> bool (S,)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1])
    res = []
    for i in rows:
        vis = visible(i)
        s = (k64 @ q64[i]) * scale
        if add is not None:
            s = s + add(i)
            vis = vis & (s != -np.inf)
        if not vis.any():
            res.append(np.zeros(v.shape[-1]))
            continue
        s = s[vis]
        w = np.exp(s - s.max())
        res.append((w / w.sum()) @ v64[vis])
    return np.array(res)


def _assert_rows(out, q, k, v, rows, visible, add=None):
    exp = _rows64(q, k, v, rows, visible, add)
    # float32 over up to 47000 keys: a few ulp of accumulation per block
    np.testing.assert_allclose(out[list(rows)].astype(np.float64), exp, rtol=2e-4, atol=2e-5)


def test_more_than_2_31_scores_causal(big_qkv):
    q, k, v = big_qkv
    out = fastattn.attention(q, k, v, is_causal=True)
    assert out.shape == (BIG, 8) and out.dtype == np.float32
    assert np.isfinite(out).all()
    _assert_rows(out, q, k, v, ROWS, lambda i: np.arange(BIG) <= i)


def test_more_than_2_31_scores_key_padding_and_broadcast_bool_mask(big_qkv):
    q, k, v = big_qkv
    rng = np.random.default_rng(1)
    kpm = rng.random(BIG) < 0.1           # True = padding
    kpm[:3] = [False, True, False]
    bm = rng.random((1, BIG)) < 0.9       # True = may attend, broadcast over all rows
    bm[0, :3] = True
    out = fastattn.attention(q, k, v, bm, is_causal=True, key_padding_mask=kpm)
    allowed = ~kpm & bm[0]
    rows = ROWS + (2,)
    _assert_rows(out, q, k, v, rows, lambda i: allowed & (np.arange(BIG) <= i))
    # rows 0 and 1 both see key 0 alone (key 1 is padding)
    np.testing.assert_allclose(out[0], v[0], rtol=1e-6)
    np.testing.assert_allclose(out[1], v[0], rtol=1e-6)


def test_more_than_2_31_entry_bool_mask_full_L_by_S(big_qkv):
    """A full (L, S) bool mask: 2.2e9 bytes, indexed beyond 2**31.

    np.zeros maps zero pages lazily: only the rows set below are ever
    backed by memory, so this costs a few MiB of RSS, not 2.2 GB.  Every
    other row has no visible key and must come out exactly 0."""
    q, k, v = big_qkv
    mask = np.zeros((BIG, BIG), dtype=bool)
    rng = np.random.default_rng(2)
    rows = (0, 5, 30000, BIG - 300, BIG - 2, BIG - 1)
    for i in rows:
        mask[i] = rng.random(BIG) < 0.5
    out = fastattn.attention(q, k, v, mask)
    _assert_rows(out, q, k, v, rows, lambda i: mask[i])
    others = np.ones(BIG, bool)
    others[list(rows)] = False
    assert np.all(out[others] == 0)


def test_more_than_2_31_entry_float_mask_full_L_by_S(big_qkv):
    """A full (L, S) additive float32 mask: 8.8e9 bytes (8.8 GB of address
    space but, as above, only a handful of rows are backed by memory; the
    zero rows read the shared zero page).  Causal, so only half is read."""
    q, k, v = big_qkv
    mask = np.zeros((BIG, BIG), dtype=np.float32)
    rng = np.random.default_rng(3)
    rows = (1, 40000, BIG - 2, BIG - 1)
    for i in rows:
        mask[i] = rng.standard_normal(BIG).astype(np.float32)
        mask[i, rng.random(BIG) < 0.2] = -np.inf
    out = fastattn.attention(q, k, v, mask, is_causal=True)
    allrows = rows + (0, 2, 64, 30000)
    _assert_rows(out, q, k, v, allrows, lambda i: np.arange(BIG) <= i,
                 add=lambda i: mask[i].astype(np.float64))

"""Boolean masks that hide or show whole (query tile x key block) regions.

The kernels summarise a boolean mask once per call, per distinct mask slice,
query tile and key block (hidden: skipped; visible: the unmasked fast path;
mixed: masked element by element).  These tests check that every state, and
the slices of a mask broadcast over some batch dimensions but not others,
give the reference's results, on every ISA path.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from conftest import _randn, assert_close, check_against_reference, finite_absmax


def _positions(L, S, lower_right=False):
    i = np.arange(L)[:, None] + (S - L if lower_right else 0)
    j = np.arange(S)[None, :]
    return i, j


def test_mask_showing_first_512_keys(isa, dtype, rng):
    L, S = 150, 1100
    q, k, v = (_randn(rng, (2, L, 32), dtype), _randn(rng, (2, S, 32), dtype),
               _randn(rng, (2, S, 24), dtype))
    _, j = _positions(L, S)
    mask = np.broadcast_to(j < 512, (L, S))
    check_against_reference(q, k, v, mask)
    got = fastattn.attention(q, k, v, mask)
    assert_close(got, fastattn.attention(q, k[:, :512], v[:, :512]), dtype,
                 magnitude=finite_absmax(v))


def test_sliding_band_bool_mask(isa, dtype, rng):
    L, S = 260, 260
    q, k, v = (_randn(rng, (2, L, 32), dtype), _randn(rng, (2, S, 32), dtype),
               _randn(rng, (2, S, 32), dtype))
    i, j = _positions(L, S)
    check_against_reference(q, k, v, (j <= i) & (j > i - 100))


def test_mask_differing_per_batch_broadcast_over_heads(isa, dtype, rng):
    # one mask slice per batch entry, shared by the heads: the summary is
    # taken per slice, and each batch entry must read its own
    L, S = 140, 600
    q, k, v = (_randn(rng, (3, 2, L, 16), dtype), _randn(rng, (3, 2, S, 16), dtype),
               _randn(rng, (3, 2, S, 16), dtype))
    i, j = _positions(L, S)
    masks = np.stack([np.broadcast_to(j < 200, (L, S)), (j <= i) & (j > i - 64),
                      np.broadcast_to(j >= 384, (L, S))])[:, None]
    check_against_reference(q, k, v, masks)
    check_against_reference(q, k, v, masks, is_causal="lower_right")


def test_blocks_hidden_visible_and_mixed_with_other_masks(isa, dtype, rng):
    L, S = 130, 700
    q, k, v = (_randn(rng, (2, L, 24), dtype), _randn(rng, (2, S, 24), dtype),
               _randn(rng, (2, S, 24), dtype))
    mask = rng.random((2, L, S)) < 0.5
    mask[:, :, 128:256] = True
    mask[:, :, 256:512] = False
    pad = np.zeros((2, S), bool)
    pad[1, 140:300] = True
    add = rng.standard_normal((L, S)).astype(dtype)
    check_against_reference(q, k, v, mask, key_padding_mask=pad)
    check_against_reference(q, k, v, mask, is_causal="lower_right", key_padding_mask=pad)
    check_against_reference(q, k, v, np.where(mask, add, -np.inf))


def test_hidden_blocks_with_nonfinite_keys_and_values(isa, dtype, rng):
    L, S = 70, 520
    q, k, v = (_randn(rng, (L, 16), dtype), _randn(rng, (S, 16), dtype),
               _randn(rng, (S, 16), dtype))
    k[300:400] = np.nan
    v[300:400] = np.inf
    _, j = _positions(L, S)
    mask = np.broadcast_to((j < 256) | (j >= 400), (L, S))
    o, _ = check_against_reference(q, k, v, mask)
    assert np.all(np.isfinite(o))


@pytest.mark.parametrize("L", [1, 3, 8])
def test_decode_bool_mask_with_key_split(isa, dtype, rng, L):
    S = 4200
    q, k, v = (_randn(rng, (2, L, 32), dtype), _randn(rng, (2, S, 32), dtype),
               _randn(rng, (2, S, 32), dtype))
    _, j = _positions(L, S)
    mask = np.broadcast_to((j >= 1000) & (j < 1700) | (j >= 4000), (2, L, S))
    check_against_reference(q, k, v, mask, return_weights=False)
    check_against_reference(q, k, v, mask)


def test_block_sparse_results_bitwise_equal_across_threads(isa, rng):
    L, S = 600, 900
    q, k, v = (_randn(rng, (2, 2, L, 32), np.float32), _randn(rng, (2, 2, S, 32), np.float32),
               _randn(rng, (2, 2, S, 32), np.float32))
    i, j = _positions(L, S)
    for mask in ((j <= i) & (j > i - 200), np.broadcast_to(j < 300, (L, S)),
                 rng.random((2, 1, L, S)) < 0.3):
        res = [fastattn.attention(q, k, v, mask, num_threads=nt) for nt in (1, 2, 3)]
        assert all(np.array_equal(res[0], r) for r in res[1:])



@pytest.mark.parametrize("lower_right", [False, True], ids=["upper_left", "lower_right"])
@pytest.mark.parametrize("left", [None, 150], ids=["causal_bool_is_causal",
                                                   "sliding_bool_is_window"])
def test_bool_mask_equals_the_native_option(isa, dtype, rng, lower_right, left):
    L, S = 300, 520
    q, k, v = (_randn(rng, (2, L, 32), dtype), _randn(rng, (2, S, 32), dtype),
               _randn(rng, (2, S, 32), dtype))
    i, j = _positions(L, S, lower_right)
    c = "lower_right" if lower_right else True
    mask = (j <= i) & (j >= i - (S if left is None else left))
    got = fastattn.attention(q, k, v, mask)
    want = fastattn.attention(q, k, v, window=(left, 0), is_causal=c)
    assert_close(got, want, dtype, magnitude=finite_absmax(v))
    check_against_reference(q, k, v, mask, return_weights=False)

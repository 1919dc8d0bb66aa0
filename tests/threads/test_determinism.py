"""Results are bitwise identical whatever ``num_threads`` is.

Shapes are chosen to give several query blocks (L=300 > 64-row tiles), several
key blocks (S=517 > 256-key blocks), the key-splitting decode path (few query
rows, S > 2 x 512 keys) and enough work to actually run in parallel.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import fastattn
from conftest import FLOAT_DTYPES, assert_close, finite_absmax, reference_attention64


THREADS = (1, 2, 3, 4)


def _assert_same_for_all_thread_counts(q, k, v, mask=None, **kwargs):
    results = []
    for n in (None,) + THREADS:
        o, w = fastattn.attention(q, k, v, mask, return_weights=True, num_threads=n, **kwargs)
        o_only = fastattn.attention(q, k, v, mask, num_threads=n, **kwargs)
        results.append((n, o, w, o_only))
    _, o1, w1, oo1 = results[1]   # num_threads=1
    for n, o, w, oo in results:
        assert np.array_equal(o, o1, equal_nan=True), f"output differs for num_threads={n}"
        assert np.array_equal(w, w1, equal_nan=True), f"weights differ for num_threads={n}"
        assert np.array_equal(oo, oo1, equal_nan=True), f"output (no weights) differs for num_threads={n}"
    return o1, w1


CASES = {
    # name: (qshape, kshape, vshape)
    "L300_S517": ((2, 300, 64), (2, 517, 64), (2, 517, 48)),
    "one_head_L300_S517": ((300, 40), (517, 40), (517, 40)),
    "decode_L1_S2100": ((2, 1, 64), (2, 2100, 64), (2, 2100, 64)),
    "decode_L3_S1500": ((1, 3, 3, 32), (1, 3, 1500, 32), (1, 3, 1500, 24)),
    "many_heads_small": ((16, 70, 33), (16, 130, 33), (16, 130, 17)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("masking", ["none", "causal_lr_mask_kpm", "causal_ul_bool"])
def test_thread_count_invariance(isa, dtype, case, masking):
    qs, ks, vs = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"{case}/{masking}".encode()))
    q = rng.standard_normal(qs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    v = rng.standard_normal(vs).astype(dtype)
    L, S = qs[-2], ks[-2]
    kwargs, mask = {}, None
    if masking == "causal_lr_mask_kpm":
        mask = rng.standard_normal((L, S)).astype(dtype)
        mask[rng.random((L, S)) < 0.1] = -np.inf
        kwargs["is_causal"] = "lower_right"
        kwargs["key_padding_mask"] = rng.random(S) < 0.1
    elif masking == "causal_ul_bool":
        mask = rng.random((L, S)) < 0.8
        kwargs["is_causal"] = True
    o, w = _assert_same_for_all_thread_counts(q, k, v, mask, **kwargs)
    if case in ("L300_S517", "decode_L1_S2100") and masking != "none":
        eo, ew = reference_attention64(q, k, v, mask, **kwargs)
        assert_close(o, eo, dtype, magnitude=finite_absmax(v), factor=2.5)
        assert_close(w, ew, dtype, factor=2.5)


def test_thread_count_invariance_gqa(isa):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 8, 300, 32)).astype(np.float32)
    k = rng.standard_normal((1, 2, 517, 32)).astype(np.float32)
    v = rng.standard_normal((1, 2, 517, 32)).astype(np.float32)
    _assert_same_for_all_thread_counts(q, k, v, enable_gqa=True, is_causal="lower_right")


def test_thread_count_invariance_float16(isa):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 300, 32)).astype(np.float16)
    k = rng.standard_normal((2, 517, 32)).astype(np.float16)
    v = rng.standard_normal((2, 517, 32)).astype(np.float16)
    _assert_same_for_all_thread_counts(q, k, v, is_causal=True)


def test_thread_count_invariance_with_nan_and_dead_rows(isa):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 300, 16))
    k = rng.standard_normal((2, 517, 16))
    v = rng.standard_normal((2, 517, 16))
    k[0, 400] = np.nan   # visible to the last rows of head 0 (lower_right)
    kpm = np.zeros((2, 517), bool)
    kpm[1, :300] = True
    m = np.ones((300, 517), bool)
    m[17] = False
    o, w = _assert_same_for_all_thread_counts(q, k, v, m, is_causal="lower_right",
                                              key_padding_mask=kpm)
    assert np.all(o[:, 17] == 0)


def test_thread_count_invariance_noncontiguous_out(isa):
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 300, 24)).astype(np.float32)
    k = rng.standard_normal((2, 517, 24)).astype(np.float32)
    v = rng.standard_normal((2, 517, 24)).astype(np.float32)
    outs = []
    for n in THREADS:
        out = np.zeros((24, 300, 2), np.float32).transpose(2, 1, 0)
        assert fastattn.attention(q, k, v, out=out, num_threads=n) is out
        outs.append(out)
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=["float32", "float64"])
def test_thread_count_invariance_decode_split_hidden_nan(isa, dtype):
    """Key-split decode path: whole key chunks padded (and poisoned with NaN/Inf)."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 1, 64)).astype(dtype)
    k = rng.standard_normal((2, 3000, 64)).astype(dtype)
    v = rng.standard_normal((2, 3000, 64)).astype(dtype)
    kpm = np.zeros((2, 3000), bool)
    kpm[0, :1100] = True
    kpm[1, 2000:] = True
    k[kpm] = np.nan
    v[kpm] = np.inf
    o, w = _assert_same_for_all_thread_counts(q, k, v, key_padding_mask=kpm)
    assert np.all(np.isfinite(o)) and np.all(w[kpm[:, None, :]] == 0)
    eo, ew = reference_attention64(q, k, v, key_padding_mask=kpm)
    assert_close(o, eo, dtype, magnitude=finite_absmax(v), factor=2.5)
    # a head whose every key is padding: zeros for any thread count
    kpm_all = kpm.copy()
    kpm_all[1] = True
    o, w = _assert_same_for_all_thread_counts(q, k, v, key_padding_mask=kpm_all)
    assert np.all(o[1] == 0) and np.all(w[1] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["streaming", "weights", "split_key", "masks_gqa"])
def test_bitwise_identical_for_thread_counts_1_2_3_7(case, dtype):
    rng = np.random.default_rng(11)

    def r(*s):
        return rng.standard_normal(s).astype(dtype)

    kw = {}
    if case == "streaming":
        q, k, v = r(3, 300, 32), r(3, 517, 32), r(3, 517, 24)
    elif case == "weights":
        q, k, v = r(2, 300, 32), r(2, 517, 32), r(2, 517, 24)
        kw["return_weights"] = True
    elif case == "split_key":
        q, k, v = r(2, 1, 64), r(2, 5000, 64), r(2, 5000, 64)
    else:
        q, k, v = r(1, 4, 200, 32), r(1, 2, 517, 32), r(1, 2, 517, 32)
        kw.update(enable_gqa=True, is_causal="lower_right",
                  key_padding_mask=rng.random((1, 517)) < 0.2,
                  attn_mask=rng.random((200, 517)) < 0.9)
    results = [fastattn.attention(q, k, v, num_threads=n, **kw) for n in (1, 2, 3, 7, None)]
    first = results[0]
    for n, res in zip((2, 3, 7, None), results[1:]):
        if kw.get("return_weights"):
            assert np.array_equal(res[0], first[0]) and np.array_equal(res[1], first[1]), n
        else:
            assert np.array_equal(res, first), f"num_threads={n} differs from 1"


# ---------------------------------------------------------------------------
# num_threads values
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [64, 10**12], ids=["64", "10**12"])
def test_num_threads_larger_than_cores(isa, n):
    """More threads than cores (even absurdly many) are clamped and give the
    one-thread result."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(s) for s in [(300, 16), (517, 16), (517, 16)])
    a = fastattn.attention(q, k, v, num_threads=1)
    b = fastattn.attention(q, k, v, num_threads=n)
    assert np.array_equal(a, b)


def test_num_threads_numpy_integer():
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal(s) for s in [(300, 16), (517, 16), (517, 16)])
    a = fastattn.attention(q, k, v, num_threads=2)
    b = fastattn.attention(q, k, v, num_threads=np.int64(2))
    assert np.array_equal(a, b)

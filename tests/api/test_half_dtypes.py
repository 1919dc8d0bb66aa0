"""The 16-bit dtypes' rules: the result dtype of every mix, the additive
mask's dtype, the weights' and lse's dtypes, the dtypes KVCache takes, and
the error naming ml_dtypes when it is missing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fastattn
from fastattn.mha import KVCache
from support import run_python

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _qkv(dq, dk, dv, L=3, S=5):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, L, 8)).astype(dq), rng.standard_normal((2, S, 8)).astype(dk),
            rng.standard_normal((2, S, 4)).astype(dv))


@pytest.mark.parametrize("dts, want", [
    ((F16, F16, F16), F16), ((BF16, BF16, BF16), BF16),
    ((F16, BF16, BF16), F32), ((BF16, F16, F16), F32),
    ((F16, F32, F16), F32), ((BF16, BF16, F32), F32), ((F32, BF16, BF16), F32),
    ((F16, F64, F16), F64), ((BF16, F64, BF16), F64),
], ids=lambda x: "-".join(d.name for d in x) if isinstance(x, tuple) else x.name)
def test_result_dtype_of_every_mix(dts, want):
    out, w, lse = fastattn.attention(*_qkv(*dts), return_weights=True, return_lse=True)
    assert out.dtype == want and w.dtype == want
    assert lse.dtype == (F64 if want == F64 else F32)


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_additive_mask_may_be_16_bit_and_float32_masks_are_accepted(dt):
    q, k, v = _qkv(dt, dt, dt)
    m16 = np.zeros((3, 5), dt)
    m16[:, 1] = -np.inf
    out16 = fastattn.attention(q, k, v, m16)
    out32 = fastattn.attention(q, k, v, m16.astype(F32))
    assert out16.dtype == out32.dtype == dt
    np.testing.assert_array_equal(out16.view(np.uint16), out32.view(np.uint16))
    # a 16-bit mask with float32 inputs is used in float32
    assert fastattn.attention(*_qkv(F32, F32, F32), m16).dtype == F32


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_softmax_and_varlen_keep_the_16_bit_dtype(dt):
    assert fastattn.softmax(np.ones((2, 3), dt), axis=-1).dtype == dt
    q = np.ones((4, 2, 8), dt)
    cu = np.array([0, 1, 4], np.int32)
    out, lse = fastattn.attention_varlen(q, q, q, cu, cu, return_lse=True)
    assert out.dtype == dt and lse.dtype == F32


@pytest.mark.parametrize("spec, want", [
    (np.float16, F16), ("float16", F16), ("bfloat16", BF16), (ml_dtypes.bfloat16, BF16),
    (BF16, BF16), ("float32", F32), (np.float64, F64)])
def test_kv_cache_dtypes(spec, want):
    assert KVCache(1, 1, 4, 8, dtype=spec).dtype == want


@pytest.mark.parametrize("bad", [np.int16, "int32", np.complex64, "float8_e4m3fn"])
def test_kv_cache_rejects_other_dtypes(bad):
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 4, 8, dtype=bad)


@pytest.mark.parametrize("dt", [F16, BF16], ids=["float16", "bfloat16"])
def test_kv_cache_rounds_float32_to_nearest_even(dt):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 64, 4)).astype(F32)
    # exact ties between neighbouring 16-bit values
    x[0, 0, :8] = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8,
                            -(1 + 2.0**-8), 2.0**-24, 65520.0, -70000.0], F32)[:, None]
    cache = KVCache(1, 2, 4, 64, dtype=dt)
    cache.append(x, x)
    with np.errstate(over="ignore"):
        want = x.astype(dt).view(np.uint16)
    np.testing.assert_array_equal(cache.keys.view(np.uint16), want)
    np.testing.assert_array_equal(cache.values.view(np.uint16), want)


def test_bfloat16_sinks_and_slopes_are_their_float32_values():
    """A bfloat16 model's parameters: exact in float32, the sinks' gradient
    in bfloat16."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 6, 8)).astype(np.float32) for _ in range(3))
    sinks = np.array([0.5, -1.25], BF16)
    slopes = np.array([0.25, 0.125], BF16)
    out, lse = fastattn.attention(q, k, v, sinks=sinks, alibi_slopes=slopes, return_lse=True)
    want = fastattn.attention(q, k, v, sinks=sinks.astype(np.float32),
                              alibi_slopes=slopes.astype(np.float32))
    assert np.array_equal(out, want)
    grads = fastattn.attention_backward(np.ones_like(out), q, k, v, out, lse, sinks=sinks,
                                        alibi_slopes=slopes)
    assert grads[3].dtype == BF16 and grads[3].shape == (2,)


def test_bfloat16_without_ml_dtypes_names_the_package():
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "from fastattn.mha import KVCache\n"
            "try:\n    KVCache(1, 1, 4, 8, dtype='bfloat16')\n"
            "except ImportError as e:\n    print('ERR', e)\n")
    res = run_python(code)
    assert "ERR" in res.stdout and "ml_dtypes" in res.stdout


def test_other_two_byte_void_dtypes_are_not_bfloat16_after_a_bfloat16_is_met():
    from fastattn import _half
    assert _half.is_bfloat16(np.dtype(ml_dtypes.bfloat16))
    assert _half.is_bfloat16(np.zeros(2, ml_dtypes.bfloat16).dtype)
    for dt in (np.dtype("V2"), np.dtype([("a", "u1"), ("b", "u1")]), np.dtype(np.float16),
               np.dtype(np.int16)):
        assert not _half.is_bfloat16(dt)
    with pytest.raises(TypeError, match="query has unsupported dtype"):
        fastattn.attention(np.zeros((2, 2), "V2"), np.ones((2, 2)), np.ones((2, 2)))

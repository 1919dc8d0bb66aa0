"""The int8 KV cache (KVCache(dtype="int8")): the quantisation of appended
rows, and attention over the cache (KVCache.attend, multi_head_attention)
against fastattn.reference over the dequantised cache (float32 rounding) and
over the original float cache (the stated quantisation bound), on every ISA
path, with GQA, the score options, hostile input and any thread count.  On
the tiers with integer dot products (conftest.Q8_DOT_ISAS) the reference
takes the queries as that kernel quantises them (conftest.q8_query), and the
bounds add the weights' quantisation (conftest.q8_dot_bound)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn._testing as _testing
import fastattn.reference as reference
from fastattn.mha import KVCache, multi_head_attention
from conftest import Q8_DOT_ISAS, examples, q8_dot_bound, q8_query, using_isa

U = 2.0 ** -24  # float32 unit roundoff
KC = 128        # keys per block of the kernel (kernels/blocking.h FA_Q8_KC)


@pytest.fixture
def rng():
    return np.random.default_rng(8128)


def _model_quantise(x):
    """The documented quantisation, in NumPy: (levels, scales)."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(axis=-1)
    s = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.where(s[..., None] > 0, np.rint(x.astype(np.float64) / s[..., None]), 0)
    return np.clip(lv, -127, 127).astype(np.int8), s


def _filled_cache(rng, B, Hkv, S, E, Ev, max_len=None, scale_k=1.0, scale_v=1.0):
    k = (rng.standard_normal((B, Hkv, S, E)) * scale_k).astype(np.float32)
    v = (rng.standard_normal((B, Hkv, S, Ev)) * scale_v).astype(np.float32)
    cache = KVCache(B, Hkv, E, max_len or max(S, 1), dtype="int8", value_dim=Ev)
    cache.append(k, v)
    return cache, k, v


def _dequantised(cache, G):
    """The cache's keys and values as float64 scale * level, each kv head
    repeated for its G query heads."""
    k = cache.keys.astype(np.float64) * cache.key_scales[..., None]
    v = cache.values.astype(np.float64) * cache.value_scales[..., None]
    return np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)


def _dot_bound(isa, cache, q, scale):
    """conftest.q8_dot_bound over the cache: (query_out, query_lse,
    weights_out, weights_typical)."""
    return q8_dot_bound(isa, q, cache.keys, cache.key_scales, cache.values,
                        cache.value_scales, scale, keys=len(cache))


def _float32_bound(cache, q, G, scale, S):
    """Per query row, the float32 rounding bound of the kernel against the
    reference over the dequantised cache (module docstring of kvcache):
    a logit is off by at most d = (E + 4) u scale max_j k_scale[j] sum|q||k8[j]|
    + 8 u max|s| (the dot product, the scalings, the exp argument); the
    weights then by a factor within exp(+-2d), the value sums by (S + 2 blocks
    + 8) u relative, twice (numerator and denominator)."""
    E = q.shape[-1]
    k8 = np.repeat(cache.keys.astype(np.float64), G, axis=1)
    ks = np.repeat(cache.key_scales.astype(np.float64), G, axis=1)
    v = np.repeat(np.abs(cache.values.astype(np.float64)) * cache.value_scales[..., None], G, 1)
    aq = np.abs(q.astype(np.float64))
    dots = np.einsum("bhle,bhse->bhls", aq, np.abs(k8)) * ks[:, :, None, :] * abs(scale)
    d = (E + 4) * U * dots.max(axis=-1, initial=0) + 8 * U * dots.max(axis=-1, initial=0)
    vmax = v.max(axis=(-2, -1), initial=0)[:, :, None]
    n = S + 2 * math.ceil(max(S, 1) / KC) + 8
    return ((np.exp(2 * d) - 1) + 2 * n * U) * vmax + 1e-30


# ---------------------------------------------------------------------------
# quantisation
# ---------------------------------------------------------------------------

def test_int8_append_quantises_rows_as_documented(rng, isa):
    k = rng.standard_normal((2, 3, 5, 7)) * np.logspace(-3, 3, 5)[None, None, :, None]
    v = rng.standard_normal((2, 3, 5, 6))
    cache = KVCache(2, 3, 7, max_len=8, dtype="int8", value_dim=6)
    cache.append(k, v)
    for got, scales, x in ((cache.keys, cache.key_scales, k), (cache.values, cache.value_scales, v)):
        lv, s = _model_quantise(x)
        np.testing.assert_array_equal(scales, s)
        np.testing.assert_array_equal(got, lv)
        err = np.abs(x.astype(np.float32) - got.astype(np.float64) * scales[..., None])
        assert (err <= scales[..., None] / 2).all()
        assert np.abs(got.astype(int)).max() == 127  # the largest entry of each row


def test_int8_rounding_ties_to_even_and_zero_rows(isa):
    row = np.array([127, 0.5, 1.5, 2.5, -0.5, -3.5, 126.5, 0], np.float32)
    x = np.stack([row, np.zeros_like(row)])[None, None]  # (1, 1, 2, 8)
    cache = KVCache(1, 1, 8, max_len=2, dtype="int8")
    cache.append(x, x)
    np.testing.assert_array_equal(cache.key_scales[0, 0], [1.0, 0.0])
    np.testing.assert_array_equal(cache.keys[0, 0, 0], [127, 0, 2, 2, 0, -4, 126, 0])
    np.testing.assert_array_equal(cache.keys[0, 0, 1], np.zeros(8))
    out = cache.attend(np.ones((1, 1, 2, 8), np.float32))
    # the zero row's key (score 0) and value (zeros) enter the softmax as such
    ref = reference.attention(np.ones((1, 1, 2, 8)), *_dequantised(cache, 1),
                              is_causal="lower_right")
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 0.037, 3.1e-3, 7.7e5])
def test_int8_rounding_of_quotients_a_hair_from_half_levels(isa, scale):
    # entries one float32 ulp either side of (k + 1/2) scale, and on it: the
    # level of the exact quotient each time (the quantiser's fast product
    # gives way to a division near a half level)
    s = np.float32(scale)
    half = ((np.arange(-127, 127) + 0.5) * np.float64(s)).astype(np.float32)
    rows = np.stack([half, np.nextafter(half, np.float32(np.inf)),
                     np.nextafter(half, np.float32(-np.inf))])
    rows = np.concatenate([rows, np.full((3, 1), 127 * s, np.float32)], axis=1)
    x = rows[None, :, None, :].repeat(1, 0)            # (1, 3, 1, 255)
    cache = KVCache(1, 3, 255, max_len=1, dtype="int8")
    cache.append(x, x)
    lv, sc = _model_quantise(x)
    np.testing.assert_array_equal(cache.key_scales, sc)
    np.testing.assert_array_equal(cache.keys, lv)


@pytest.mark.parametrize("amax", [1e-44, 3e-42, 1e-40, 1.1e-36, 3e38])
def test_int8_tiny_and_huge_rows_keep_the_error_bound(rng, isa, amax):
    x = rng.uniform(-1, 1, (1, 1, 4, 16))
    x[..., 0] = 1
    x = (x * amax).astype(np.float32)
    cache = KVCache(1, 1, 16, max_len=4, dtype="int8")
    cache.append(x, x)
    s = cache.key_scales.astype(np.float64)[..., None]
    lv = cache.keys.astype(np.float64)
    assert (s > 0).all() and np.abs(lv).max() <= 127
    assert (np.abs(x - lv * s) <= s / 2).all()
    assert (s <= np.abs(x).max(axis=-1, keepdims=True) / 127 * (1 + 1e-6) + 2.0 ** -148).all()


@pytest.mark.parametrize("what", ["keys", "values"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_int8_nonfinite_append_raises_and_leaves_cache(rng, what, bad):
    cache, _, _ = _filled_cache(rng, 1, 2, 3, 4, 4, max_len=8)
    before = (cache.keys.copy(), cache.values.copy(), cache.key_scales.copy())
    k = rng.standard_normal((1, 2, 2, 4))
    v = rng.standard_normal((1, 2, 2, 4))
    (k if what == "keys" else v)[0, 1, 1, 2] = bad
    with pytest.raises(ValueError, match=what):
        cache.append(k, v)
    assert len(cache) == 3
    for a, b in zip(before, (cache.keys, cache.values, cache.key_scales)):
        np.testing.assert_array_equal(a, b)


def test_int8_cache_dtype_parsing_and_errors():
    assert KVCache(1, 1, 4, 4, dtype="int8").dtype == np.int8
    assert KVCache(1, 1, 4, 4, dtype=np.int8).dtype == np.int8
    assert "int8" in repr(KVCache(1, 1, 4, 4, dtype="int8"))
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 4, 4, dtype="int4")
    with pytest.raises(TypeError, match="dtype"):
        KVCache(1, 1, 4, 4, dtype=np.int16)
    with pytest.raises(AttributeError, match="scales"):
        KVCache(1, 1, 4, 4).key_scales
    cache = KVCache(1, 1, 4, 4, dtype="int8")
    with pytest.raises(TypeError, match="keys"):
        cache.append(np.ones((1, 1, 1, 4), complex), np.ones((1, 1, 1, 4)))
    cache.append(np.ones((1, 1, 2, 4)), np.ones((1, 1, 2, 4)))
    with pytest.raises(TypeError, match="float32"):
        cache.attend(np.ones((1, 1, 1, 4)))                # float64 query
    with pytest.raises(ValueError, match="query"):
        cache.attend(np.ones((1, 1, 1, 5), np.float32))    # wrong head_dim
    with pytest.raises(ValueError, match="key_padding_mask"):
        cache.attend(np.ones((1, 1, 1, 4), np.float32), key_padding_mask=np.ones(3, bool))


# ---------------------------------------------------------------------------
# attention over the cache
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("B, Hq, Hkv, L, S, E, Ev", [
    (1, 4, 4, 1, 300, 64, 64),     # plain decode, several key blocks
    (2, 8, 2, 1, 130, 33, 17),     # GQA, odd head dims (vector tails)
    (1, 2, 2, 1, 100, 19, 24),     # one row per kv head, a key tail and a dim tail
    (1, 6, 1, 3, 257, 16, 40),     # multi-query, a multi-token append
    (2, 4, 2, 5, 5, 7, 1),         # prefill: L = S
    (1, 2, 1, 12, 9, 8, 8),        # L > S: the first rows see nothing
])
def test_int8_attend_matches_reference_on_dequantised_cache(rng, isa, B, Hq, Hkv, L, S, E, Ev):
    cache, k, v = _filled_cache(rng, B, Hkv, S, E, Ev)
    q = rng.standard_normal((B, Hq, L, E)).astype(np.float32)
    G = Hq // Hkv
    out, lse = cache.attend(q, return_lse=True)
    assert out.dtype == np.float32 and out.shape == (B, Hq, L, Ev)
    kd, vd = _dequantised(cache, G)
    ref, ref_lse = reference.attention(q8_query(isa, q), kd, vd, is_causal="lower_right",
                                       return_lse=True)
    qo, _, wo, wt = _dot_bound(isa, cache, q, 1 / math.sqrt(E))
    bound = _float32_bound(cache, q, G, 1 / math.sqrt(E), S) + wo
    assert (np.abs(out - ref) <= bound[..., None]).all(), np.abs(out - ref).max()
    # the worst-case bound is far above typical float32 errors: those too
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 + wt)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    # against the original float cache: the quantisation bound of the docstring
    qd = np.abs(q.astype(np.float64)).sum(-1)                           # (B, Hq, L)
    ks = np.repeat(cache.key_scales, G, axis=1).max(-1, initial=0)       # (B, Hq)
    d = (1 / math.sqrt(E)) * ks[..., None] / 2 * qd
    vmax = np.repeat(np.abs(v), G, axis=1).max(axis=(-2, -1))[..., None]
    vs = np.repeat(cache.value_scales, G, axis=1).max(-1)[..., None]
    orig = reference.attention(q.astype(np.float64), np.repeat(k, G, 1).astype(np.float64),
                               np.repeat(v, G, 1).astype(np.float64), is_causal="lower_right")
    stated = (np.exp(2 * d) - 1) * vmax + vs / 2 + bound + qo
    assert (np.abs(out - orig) <= stated[..., None]).all()
    if L > S:
        assert (out[:, :, :L - S] == 0).all() and (lse[:, :, :L - S] == -np.inf).all()


@pytest.mark.parametrize("E", [64, 96, 48, 40])
@pytest.mark.parametrize("G", range(1, 9))
def test_int8_attend_every_query_rows_per_kv_head_and_head_size_matches_reference(rng, isa, G, E):
    """1 to 8 query rows per KV head (the kernel's row counts) with head sizes
    that the byte products take in groups of 4, 2 and 1 rows (64), of 4 and 2
    but not 1 (96), of 4 only (48), or not at all (40)."""
    S, Hkv = 150, 2
    cache, _, _ = _filled_cache(rng, 1, Hkv, S, E, E)
    q = rng.standard_normal((1, Hkv * G, 1, E)).astype(np.float32)
    out, lse = cache.attend(q, return_lse=True)
    ref, ref_lse = reference.attention(q8_query(isa, q), *_dequantised(cache, G),
                                       is_causal="lower_right", return_lse=True)
    _, _, wo, wt = _dot_bound(isa, cache, q, 1 / math.sqrt(E))
    bound = _float32_bound(cache, q, G, 1 / math.sqrt(E), S) + wo
    assert (np.abs(out - ref) <= bound[..., None]).all(), np.abs(out - ref).max()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 + wt)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opts", [
    dict(window=(17, None)),
    dict(window=(3, 0), softcap=2.5),
    dict(alibi_slopes="slopes", sinks="sinks"),
    dict(sinks=np.array([-np.inf, 0.5, 40.0, -3.0])),
    dict(softcap=30.0, alibi_slopes="slopes", window=50, key_padding_mask="pad"),
    dict(key_padding_mask="pad", scale=0.3),
])
def test_int8_attend_options_match_reference(rng, isa, opts):
    B, Hq, Hkv, L, S, E = 2, 4, 2, 3, 200, 32
    cache, _, _ = _filled_cache(rng, B, Hkv, S, E, E)
    q = rng.standard_normal((B, Hq, L, E)).astype(np.float32)
    opts = dict(opts)
    if opts.get("alibi_slopes") == "slopes":
        opts["alibi_slopes"] = np.linspace(0.01, 0.3, Hq)
    if isinstance(opts.get("sinks"), str):
        opts["sinks"] = rng.standard_normal((B, Hq))
    if isinstance(opts.get("key_padding_mask"), str):
        pad = rng.random((B, S)) < 0.3
        pad[1, :] = True                       # a batch with every key hidden
        opts["key_padding_mask"] = pad
    out, lse = cache.attend(q, return_lse=True, **opts)
    kd, vd = _dequantised(cache, Hq // Hkv)
    ref, ref_lse = reference.attention(q8_query(isa, q), kd, vd, is_causal="lower_right",
                                       return_lse=True, **opts)
    sc = opts.get("scale", 1 / math.sqrt(E))
    _, _, wo, wt = _dot_bound(isa, cache, q, sc)
    bound = _float32_bound(cache, q, Hq // Hkv, sc, S) * 4 + wo
    assert (np.abs(out - ref) <= bound[..., None]).all(), np.abs(out - ref).max()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 + wt)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


@settings(max_examples=examples(40))
@given(B=st.integers(1, 2), Hkv=st.integers(1, 3), G=st.integers(1, 3), L=st.integers(1, 4),
       S=st.integers(0, 300), E=st.integers(1, 40), Ev=st.integers(1, 40),
       left=st.one_of(st.none(), st.integers(0, 300)), seed=st.integers(0, 2 ** 32 - 1))
def test_int8_attend_random_problems_match_reference(isa, B, Hkv, G, L, S, E, Ev, left, seed):
    rng = np.random.default_rng(seed)
    cache, _, _ = _filled_cache(rng, B, Hkv, S, E, Ev, max_len=max(S, 1))
    q = rng.standard_normal((B, Hkv * G, L, E)).astype(np.float32)
    out, lse = cache.attend(q, window=(left, None), return_lse=True)
    ref, ref_lse = reference.attention(q8_query(isa, q), *_dequantised(cache, G),
                                       is_causal="lower_right", window=(left, None),
                                       return_lse=True)
    _, _, wo, wt = _dot_bound(isa, cache, q, 1 / math.sqrt(E))
    bound = _float32_bound(cache, q, G, 1 / math.sqrt(E), S) + wo
    assert (np.abs(out - ref) <= bound[..., None]).all()
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 + wt)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


def test_int8_float16_queries_are_computed_as_float32(rng):
    cache, _, _ = _filled_cache(rng, 1, 2, 50, 16, 16)
    q = rng.standard_normal((1, 4, 2, 16)).astype(np.float16)
    np.testing.assert_array_equal(cache.attend(q), cache.attend(q.astype(np.float32)))


def test_int8_append_of_bfloat16_quantises_its_float32_widening(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is needed for bfloat16")
    k = rng.standard_normal((1, 2, 5, 16)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((1, 2, 5, 16)).astype(ml_dtypes.bfloat16)
    a = fastattn.KVCache(1, 2, 16, 8, dtype="int8")
    b = fastattn.KVCache(1, 2, 16, 8, dtype="int8")
    a.append(k, v)
    b.append(k.astype(np.float32), v.astype(np.float32))
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.key_scales, b.key_scales)
    np.testing.assert_array_equal(a.value_scales, b.value_scales)


def test_int8_hostile_queries_give_reference_nan_pattern(rng, isa):
    cache, _, _ = _filled_cache(rng, 1, 2, 40, 8, 8)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    q[0, 0, 1, 3] = np.nan
    q[0, 1, 2, 0] = np.inf
    out, lse = cache.attend(q, return_lse=True)
    ref, ref_lse = reference.attention(q.astype(np.float64), *_dequantised(cache, 1),
                                       is_causal="lower_right", return_lse=True)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    ok = ~np.isnan(ref)
    # the rows grouped with a NaN one run the float kernel: against q itself
    qo, _, wo, _ = _dot_bound(isa, cache, q, 1 / math.sqrt(8))
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-5 + qo + wo)


def test_int8_large_finite_values_stay_finite(rng, isa):
    cache, _, _ = _filled_cache(rng, 1, 1, 50, 16, 16, scale_k=1e-3, scale_v=1e37)
    q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    out = cache.attend(q)
    ref = reference.attention(q.astype(np.float64), *_dequantised(cache, 1),
                              is_causal="lower_right")
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_int8_threads_bitwise_identical(rng):
    cache, _, _ = _filled_cache(rng, 2, 3, 700, 64, 64)
    q = rng.standard_normal((2, 6, 2, 64)).astype(np.float32)
    outs = [cache.attend(q, num_threads=t, return_lse=True) for t in (1, 2, 3)]
    for o, lse in outs[1:]:
        np.testing.assert_array_equal(o, outs[0][0])
        np.testing.assert_array_equal(lse, outs[0][1])


def test_int8_isa_paths_agree_closely(rng):
    """Every path against the first, and each against the reference over the
    dequantised cache (so that one path alone is checked too)."""
    cache, _, _ = _filled_cache(rng, 1, 2, 333, 48, 48)
    q = rng.standard_normal((1, 4, 2, 48)).astype(np.float32)
    res = {}
    for name in fastattn.available_isas():
        ref = reference.attention(q8_query(name, q), *_dequantised(cache, 2),
                                  is_causal="lower_right")
        with using_isa(name):
            out = cache.attend(q)
        wt = _dot_bound(name, cache, q, 1 / math.sqrt(48))[3]
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 + wt, err_msg=name)
        # each kind of kernel (float; integer dot products) against its first path
        first = res.setdefault(name in Q8_DOT_ISAS, out)
        np.testing.assert_allclose(out, first, rtol=1e-5, atol=1e-6, err_msg=name)


def test_int8_allocation_failure_raises_memory_error(rng):
    cache, _, _ = _filled_cache(rng, 1, 1, 20, 8, 8)
    q = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)
    expected = cache.attend(q)
    try:
        _testing.fail_alloc_after(0)
        with pytest.raises(MemoryError):
            cache.attend(q)
    finally:
        _testing.fail_alloc_after(-1)
    np.testing.assert_array_equal(cache.attend(q), expected)


def test_int8_empty_cache_and_empty_query(rng):
    cache = KVCache(1, 2, 8, max_len=4, dtype="int8")
    out, lse = cache.attend(np.ones((1, 2, 1, 8), np.float32), return_lse=True)
    assert (out == 0).all() and (lse == -np.inf).all()
    assert cache.attend(np.ones((1, 2, 0, 8), np.float32)).shape == (1, 2, 0, 8)


# ---------------------------------------------------------------------------
# multi_head_attention with an int8 cache
# ---------------------------------------------------------------------------

def _weights(rng, d_model, heads, kv_heads, d):
    w = lambda r, c: (rng.standard_normal((r, c)) / math.sqrt(r)).astype(np.float32)  # noqa: E731
    return (w(d_model, heads * d), w(d_model, kv_heads * d), w(d_model, kv_heads * d),
            w(heads * d, d_model))


def test_int8_mha_decode_steps_match_one_call_and_reference(rng):
    d_model, heads, kv_heads, d, T = 32, 4, 2, 8, 9
    # dyadic inputs and weights (multiples of 1/4 and 1/16), so every projection is
    # exact in float32: BLAS may sum a 1-row and a 9-row matmul in different orders
    # (OpenBLAS on Zen 5 does), which must not reach the cache comparison below
    x = np.round(rng.standard_normal((2, T, d_model)) * 4).astype(np.float32) / 4
    w_q, w_k, w_v, w_o = (np.round(w * 16) / 16 for w in
                          _weights(rng, d_model, heads, kv_heads, d))
    steps_cache = KVCache(2, kv_heads, d, max_len=T, dtype="int8")
    parts = [multi_head_attention(x[:, :4], w_q, w_k, w_v, w_o, heads, num_kv_heads=kv_heads,
                                  kv_cache=steps_cache)]
    for t in range(4, T):
        parts.append(multi_head_attention(x[:, t:t + 1], w_q, w_k, w_v, w_o, heads,
                                          num_kv_heads=kv_heads, kv_cache=steps_cache))
    steps = np.concatenate(parts, axis=1)
    one_cache = KVCache(2, kv_heads, d, max_len=T, dtype="int8")
    one = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, num_kv_heads=kv_heads,
                               kv_cache=one_cache)
    # chunking does not change what is stored (rows are quantised one by one)
    np.testing.assert_array_equal(steps_cache.keys, one_cache.keys)
    np.testing.assert_array_equal(steps_cache.value_scales, one_cache.value_scales)
    assert steps.dtype == np.float32
    np.testing.assert_allclose(steps, one, rtol=1e-5, atol=1e-5)
    full = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, num_kv_heads=kv_heads,
                                is_causal=True)
    np.testing.assert_allclose(steps, full, rtol=0.05, atol=0.05)  # int8 vs float32


def test_int8_mha_rejects_unsupported_options_before_caching(rng):
    d_model, heads, d = 16, 2, 8
    x = rng.standard_normal((1, 2, d_model)).astype(np.float32)
    w_q, w_k, w_v, w_o = _weights(rng, d_model, heads, heads, d)
    cache = KVCache(1, heads, d, max_len=4, dtype="int8")
    with pytest.raises(ValueError, match="return_weights"):
        multi_head_attention(x, w_q, w_k, w_v, w_o, heads, kv_cache=cache, return_weights=True)
    with pytest.raises(ValueError, match="attn_mask"):
        multi_head_attention(x, w_q, w_k, w_v, w_o, heads, kv_cache=cache,
                             attn_mask=np.ones((2, 2), bool))
    with pytest.raises(TypeError, match="int8"):
        multi_head_attention(x.astype(np.float64), w_q, w_k, w_v, w_o, heads, kv_cache=cache)
    assert len(cache) == 0
    out, lse = multi_head_attention(x, w_q, w_k, w_v, w_o, heads, kv_cache=cache,
                                    return_lse=True, window=1, softcap=5.0,
                                    key_padding_mask=np.array([False, True]))
    assert out.shape == (1, 2, d_model) and lse.shape == (1, heads, 2) and len(cache) == 2


def test_float_cache_attend_is_attention_lower_right(rng):
    k = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    cache = KVCache(2, 2, 8, max_len=10)
    cache.append(k, v)
    q = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
    pad = rng.random((2, 7)) < 0.3
    got = cache.attend(q, key_padding_mask=pad, window=2)
    want = fastattn.attention(q, k, v, is_causal="lower_right", enable_gqa=True,
                              key_padding_mask=pad, window=2)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kw,match", [({"alibi_slopes": [1e39]}, "alibi_slopes .* range of float32"),
                                      ({"sinks": [1e39]}, "sinks .* range of float32"),
                                      ({"softcap": 1e-46}, "softcap must be finite and > 0"),
                                      ({"scale": 10**400}, "scale must be finite")],
                         ids=["slopes_beyond_float32", "sinks_beyond_float32",
                              "softcap_rounding_to_0", "scale_beyond_float64"])
def test_int8_attend_refuses_options_beyond_float32_as_float_caches_do(kw, match):
    cache = KVCache(1, 1, 4, 8, dtype="int8")
    cache.append(np.ones((1, 1, 3, 4)), np.ones((1, 1, 3, 4)))
    with pytest.raises(ValueError, match=match):
        cache.attend(np.ones((1, 1, 1, 4), np.float32), **kw)


def test_int8_attend_window_beyond_int64_bounds_nothing():
    cache = KVCache(1, 1, 4, 8, dtype="int8")
    cache.append(np.ones((1, 1, 3, 4)), np.arange(12.0).reshape(1, 1, 3, 4))
    q = np.ones((1, 1, 1, 4), np.float32)
    np.testing.assert_array_equal(cache.attend(q, window=2**70), cache.attend(q))

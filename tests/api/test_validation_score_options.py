"""Validation of softcap, alibi_slopes, sinks and return_lse: clear errors
naming the argument and shapes, and ``out=`` untouched on error."""

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference


@pytest.fixture
def qkv():
    rng = np.random.default_rng(3)
    return tuple(rng.standard_normal((2, 3, 5, 4)).astype(np.float32) for _ in range(3))


BAD = [
    (dict(softcap=0.0), ValueError, "softcap must be finite and > 0"),
    (dict(softcap=-1.0), ValueError, "softcap must be finite and > 0"),
    (dict(softcap=np.inf), ValueError, "softcap must be finite and > 0"),
    (dict(softcap=np.nan), ValueError, "softcap must be finite and > 0"),
    (dict(softcap=1e300), ValueError, "softcap must be finite and > 0 in float32"),
    (dict(softcap=1e-46), ValueError, "softcap must be finite and > 0 in float32"),
    (dict(softcap=10**400), ValueError, "softcap must be finite and > 0"),
    (dict(softcap=1e-40), ValueError, r"softcap must be >= 1/FLT_MAX \(2.9e-39\) in float32"),
    (dict(softcap=1e-310), ValueError, r"softcap must be >= 1/DBL_MAX"),
    (dict(softcap=True), TypeError, "softcap must be a positive float"),
    (dict(softcap="2"), TypeError, "softcap must be a positive float"),
    (dict(softcap=[2.0]), TypeError, "softcap must be a positive float"),
    (dict(alibi_slopes=np.ones(4)), ValueError, r"alibi_slopes of shape \(4,\) is not "
                                                r"broadcastable to \(\.\.\., H\) = \(2, 3\)"),
    (dict(alibi_slopes=np.ones((3, 3))), ValueError, r"alibi_slopes of shape \(3, 3\)"),
    (dict(alibi_slopes=[0.1, np.inf, 0.2]), ValueError, "alibi_slopes .* non-finite"),
    (dict(alibi_slopes=[0.1, np.nan, 0.2]), ValueError, "alibi_slopes .* non-finite"),
    (dict(alibi_slopes=[0.1, 1e300, 0.2]), ValueError, "alibi_slopes .* range of float32"),
    (dict(alibi_slopes=[True, False, True]), TypeError, "alibi_slopes must be a real array"),
    (dict(alibi_slopes=["a", "b", "c"]), TypeError, "alibi_slopes must be a real array"),
    (dict(sinks=np.ones(2)), ValueError, r"sinks of shape \(2,\) is not broadcastable"),
    (dict(sinks=[0.0, np.nan, 1.0]), ValueError, r"sinks .* NaN or \+inf"),
    (dict(sinks=[0.0, np.inf, 1.0]), ValueError, r"sinks .* NaN or \+inf"),
    (dict(sinks=[0.0, 1e300, 1.0]), ValueError, "sinks .* range of float32"),
    (dict(sinks=np.ones(3, complex)), TypeError, "sinks must be a real array"),
]


@pytest.mark.parametrize("kw,exc,match", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_options_raise_and_leave_out_untouched(qkv, kw, exc, match):
    q, k, v = qkv
    out = np.full((2, 3, 5, 4), 7.0, np.float32)
    with pytest.raises(exc, match=match):
        fastattn.attention(q, k, v, out=out, return_lse=True, **kw)
    assert np.all(out == 7.0)


@pytest.mark.parametrize("kw,exc,match", [b for b in BAD if "range of float32" not in b[2]
                                          and "in float32" not in b[2]])
def test_reference_raises_the_same(qkv, kw, exc, match):
    q, k, v = qkv
    with pytest.raises(exc, match=match):
        reference.attention(q, k, v, **kw)


@pytest.mark.parametrize("name", ["alibi_slopes", "sinks"])
def test_per_head_options_need_a_head_axis(name):
    x = np.ones((5, 4))
    with pytest.raises(ValueError, match=f"{name} needs a head axis"):
        fastattn.attention(x, x, x, **{name: [0.5]})


def test_negative_infinite_sink_is_accepted_as_no_sink(qkv):
    """A sink of -inf is valid (exp(-inf) = 0 joins no row's sum): the result
    and lse are bitwise those of the call without sinks."""
    q, k, v = qkv
    out, lse = fastattn.attention(q, k, v, sinks=-np.inf, return_lse=True)
    want, want_lse = fastattn.attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_float64_accepts_what_float32_cannot_hold(qkv):
    q, k, v = (a.astype(np.float64) for a in qkv)
    out, lse = fastattn.attention(q, k, v, sinks=[0.0, -1e300, 1.0], softcap=1e300,
                                  return_lse=True)
    assert lse.dtype == np.float64 and np.all(np.isfinite(lse))


def test_return_order_and_shapes(qkv):
    q, k, v = qkv
    out, lse = fastattn.attention(q, k, v, return_lse=True)
    assert out.shape == (2, 3, 5, 4) and lse.shape == (2, 3, 5) and lse.dtype == np.float32
    out, w, lse = fastattn.attention(q, k, v, return_lse=True, return_weights=True)
    assert w.shape == (2, 3, 5, 5) and lse.shape == (2, 3, 5)
    assert isinstance(fastattn.attention(q, k, v, softcap=1.0), np.ndarray)


def test_merge_attention_is_public():
    assert "merge_attention" in fastattn.__all__
    from fastattn.merge import merge_attention
    assert fastattn.merge_attention is merge_attention


@pytest.mark.parametrize("cap", [1e-300, 1e-308])
def test_tiny_softcap_with_a_finite_reciprocal_matches_the_reference_in_float64(cap):
    # a score of exactly 0 times an infinite 1/softcap was NaN: the cap's
    # reciprocal must be finite, and where it is the result is the reference's
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out, lse = fastattn.attention(x, x, x, softcap=cap, return_lse=True)
    ref_out, ref_lse = reference.attention(x, x, x, softcap=cap, return_lse=True)
    np.testing.assert_allclose(out, ref_out, rtol=1e-13)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-13)

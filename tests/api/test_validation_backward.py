"""attention_backward's checks: grad_out, out, lse and grad_lse against the
forward call, each error naming the argument; forward arguments rejected as
attention() rejects them."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn


@pytest.fixture
def forward():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 9, 4)) for _ in range(3))
    out, lse = fastattn.attention(q, k, v, is_causal=True, return_lse=True)
    return rng.standard_normal(out.shape), q, k, v, out, lse


def test_grad_out_of_another_shape_is_named(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="grad_out.*shape"):
        fastattn.attention_backward(d_o[..., :2], q, k, v, out, lse, is_causal=True)


def test_grad_out_of_another_dtype_is_named(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="grad_out.*float64.*float32"):
        fastattn.attention_backward(d_o.astype(np.float32), q, k, v, out, lse, is_causal=True)


def test_out_of_another_shape_is_named(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="out must"):
        fastattn.attention_backward(d_o, q, k, v, out[:, :1], lse, is_causal=True)


def test_lse_of_another_shape_or_dtype_is_named(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="lse must"):
        fastattn.attention_backward(d_o, q, k, v, out, lse[..., None], is_causal=True)
    with pytest.raises(ValueError, match="lse must.*float32"):
        fastattn.attention_backward(d_o, q, k, v, out, lse.astype(np.float32), is_causal=True)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "plus_inf"])
def test_lse_nan_or_plus_inf_is_refused(forward, bad):
    d_o, q, k, v, out, lse = forward
    lse = lse.copy()
    lse[1, 2, 3] = bad
    with pytest.raises(ValueError, match="lse .*NaN or \\+inf"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True)


def test_lse_minus_inf_on_a_row_that_sees_keys_is_refused(forward):
    d_o, q, k, v, out, lse = forward
    lse = lse.copy()
    lse[0, 1, 5] = -np.inf
    with pytest.raises(ValueError, match="lse is -inf on a row that sees keys"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True)


def test_lse_minus_inf_on_a_hidden_row_is_accepted(forward):
    d_o, q, k, v, out, lse = forward
    mask = np.ones((9, 9), bool)
    mask[4] = False
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True)
    assert np.isneginf(lse[..., 4]).all()
    dq = fastattn.attention_backward(d_o, q, k, v, out, lse, mask)[0]
    assert not dq[..., 4, :].any()


def test_grad_lse_of_another_shape_or_a_bool_dtype_is_named(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="grad_lse must have lse's shape"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True,
                                    grad_lse=lse[..., :3])
    with pytest.raises(TypeError, match="grad_lse must be floating point"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, is_causal=True,
                                    grad_lse=np.zeros(lse.shape, bool))


def test_forward_arguments_are_checked_as_attention_checks_them(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(ValueError, match="softcap"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, softcap=-1.0)
    with pytest.raises(ValueError, match="sinks"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, sinks=np.zeros(5))
    with pytest.raises(ValueError, match="key's last dimension"):
        fastattn.attention_backward(d_o, q, k[..., :3], v, out, lse)
    with pytest.raises(TypeError, match="attn_mask"):
        fastattn.attention_backward(d_o, q, k, v, out, lse, np.ones((9, 9), int))


def test_options_are_keyword_only(forward):
    d_o, q, k, v, out, lse = forward
    with pytest.raises(TypeError):
        fastattn.attention_backward(d_o, q, k, v, out, lse, None, False, None, False, None)


def test_grad_sinks_has_the_shape_and_dtype_of_sinks(forward):
    d_o, q, k, v, out, lse = forward
    sinks = np.array([0.5], np.float32)                  # broadcast over (2, 3)
    out, lse = fastattn.attention(q, k, v, sinks=sinks, return_lse=True)
    *_, d_t = fastattn.attention_backward(d_o, q, k, v, out, lse, sinks=sinks)
    assert d_t.shape == (1,) and d_t.dtype == np.float32

"""fastattn.reference.attention_backward: the float64 ground truth of the
backward pass, checked against central differences of the reference forward
and against torch autograd of an eager formula."""

import numpy as np
import pytest

from fastattn import reference
from fastattn.reference import attention_backward

OPTIONS = {
    "plain": {},
    "causal": {"is_causal": True},
    "lower_right": {"is_causal": "lower_right"},
    "window": {"window": (2, 1)},
    "softcap": {"softcap": 1.5},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25])},
    "sinks": {"sinks": np.array([0.3, -0.7])},
    "pad": {"key_padding_mask": np.array([[False] * 5 + [True, False]])},
    "bool_mask": {"attn_mask": np.tri(4, 7, 3, dtype=bool)},
    "additive_mask": {"attn_mask": np.linspace(-1, 1, 28).reshape(4, 7)},
    "all": {"is_causal": "lower_right", "window": (3, None), "softcap": 2.0,
            "alibi_slopes": np.array([0.5, 0.25]), "sinks": np.array([0.1, 0.9])},
}


def _problem(seed, shape_q=(1, 2, 4, 3), shape_k=(1, 2, 7, 3)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q)
    k = rng.standard_normal(shape_k)
    v = rng.standard_normal(shape_k[:-1] + (5,))
    out, lse = reference.attention(q, k, v, return_lse=True)
    d_o = rng.standard_normal(out.shape)
    g = rng.standard_normal(lse.shape)
    return q, k, v, d_o, g


def _loss(q, k, v, d_o, g, opts):
    out, lse = reference.attention(q, k, v, return_lse=True, **opts)
    live = np.isfinite(lse)
    return float(np.sum(out * d_o) + np.sum(np.where(live, lse, 0.0) * g))


def _numeric_grad(f, x, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        grad[idx] = (f(xp) - f(xm)) / (2 * h)
    return grad


def _backward(q, k, v, d_o, g, opts, **extra):
    out, lse = reference.attention(q, k, v, return_lse=True, **opts, **extra)
    return attention_backward(d_o, q, k, v, out, lse, grad_lse=g, **opts, **extra)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_gradients_match_central_differences(name):
    opts = OPTIONS[name]
    q, k, v, d_o, g = _problem(3)
    grads = _backward(q, k, v, d_o, g, opts)
    for i, x in enumerate((q, k, v)):
        def f(xi, i=i):
            args = [q, k, v]
            args[i] = xi
            return _loss(*args, d_o, g, opts)
        np.testing.assert_allclose(grads[i], _numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    if "sinks" in opts:
        t = opts["sinks"]
        f = lambda ti: _loss(q, k, v, d_o, g, {**opts, "sinks": ti})  # noqa: E731
        np.testing.assert_allclose(grads[3], _numeric_grad(f, t), rtol=1e-6, atol=1e-8)
        assert grads[3].shape == t.shape


def test_gqa_and_broadcast_batch_gradients_are_summed_to_the_input_shapes():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 3, 3))
    k = rng.standard_normal((1, 2, 6, 3))    # batch broadcast, 2 key/value heads
    v = rng.standard_normal((1, 2, 6, 2))
    opts = {"enable_gqa": True, "is_causal": True}
    out, lse = reference.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape)
    dq, dk, dv = attention_backward(d_o, q, k, v, out, lse, **opts)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    for i, x in enumerate((q, k, v)):
        def f(xi, i=i):
            args = [q, k, v]
            args[i] = xi
            return float(np.sum(reference.attention(*args, **opts) * d_o))
        np.testing.assert_allclose((dq, dk, dv)[i], _numeric_grad(f, x), rtol=1e-6,
                                   atol=1e-8)


def test_row_with_nothing_visible_gets_zero_gradients_not_nan():
    q, k, v, d_o, g = _problem(7)
    mask = np.ones((4, 7), dtype=bool)
    mask[1] = False
    dq, dk, dv, dt = _backward(q, k, v, d_o, g, {"attn_mask": mask,
                                                 "sinks": np.array([0.2, 0.4])})
    assert np.all(dq[..., 1, :] == 0)
    for d in (dq, dk, dv, dt):
        assert np.all(np.isfinite(d))


def test_nan_and_inf_in_hidden_keys_and_values_never_reach_a_gradient():
    q, k, v, d_o, g = _problem(9)
    pad = np.zeros((1, 7), dtype=bool)
    pad[0, 4] = True
    k2, v2 = k.copy(), v.copy()
    k2[..., 4, :] = np.nan
    v2[..., 4, :] = np.inf
    opts = {"key_padding_mask": pad, "is_causal": True}
    clean = _backward(q, k, v, d_o, g, opts)
    dirty = _backward(q, k2, v2, d_o, g, opts)
    for a, b in zip(clean, dirty):
        np.testing.assert_array_equal(np.delete(a, 4, axis=-2) if a.shape[-2] == 7 else a,
                                      np.delete(b, 4, axis=-2) if b.shape[-2] == 7 else b)
    assert np.all(dirty[1][..., 4, :] == 0) and np.all(dirty[2][..., 4, :] == 0)


def test_sixteen_bit_inputs_give_gradients_in_their_dtype():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, d_o, g = _problem(11)
    for dt in (np.float16, ml_dtypes.bfloat16):
        qh, kh, vh = (a.astype(dt) for a in (q, k, v))
        grads = _backward(qh, kh, vh, d_o, g, {})
        exact = _backward(*(a.astype(np.float64) for a in (qh, kh, vh)), d_o, g, {})
        for d, e in zip(grads, exact):
            assert d.dtype == np.dtype(dt)
            np.testing.assert_array_equal(d, e.astype(dt))   # rounded once


def test_out_of_another_shape_is_a_value_error_naming_out():
    q, k, v, d_o, g = _problem(13)
    out, lse = reference.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="out must have shape"):
        attention_backward(d_o, q, k, v, out[..., :2], lse)


def _torch_eager(torch, q, k, v, scale, softcap, slopes, sinks, hidden):
    """The forward's semantics, written in torch for autograd."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    L, S = s.shape[-2:]
    if slopes is not None:
        dist = (torch.arange(L)[:, None] + S - L - torch.arange(S)[None, :]).abs()
        s = s - slopes[:, None, None] * dist.to(s.dtype)
    s = s.masked_fill(torch.from_numpy(hidden), float("-inf"))
    col = sinks[:, None, None].expand(*s.shape[:-1], 1)
    full = torch.cat([s, col], dim=-1)
    p = torch.softmax(full, dim=-1)[..., :-1]
    return torch.matmul(p, v), torch.logsumexp(full, dim=-1)


def test_gradients_match_torch_autograd_of_the_eager_formula():
    torch = pytest.importorskip("torch")
    q, k, v, d_o, g = _problem(17, (1, 2, 5, 4), (1, 2, 9, 4))
    d_o = np.random.default_rng(1).standard_normal((1, 2, 5, 5))
    g = np.random.default_rng(2).standard_normal((1, 2, 5))
    opts = {"is_causal": "lower_right", "window": (4, None), "softcap": 3.0,
            "alibi_slopes": np.array([0.3, 0.6]), "sinks": np.array([0.5, -1.0])}
    mine = _backward(q, k, v, d_o, g, opts)
    i = np.arange(5)[:, None] + 4
    j = np.arange(9)[None, :]
    hidden = (j > i) | (j < i - 4)
    tq, tk, tv, tt = (torch.tensor(a, requires_grad=True) for a in
                      (q, k, v, opts["sinks"]))
    o, lse = _torch_eager(torch, tq, tk, tv, 0.5, 3.0, torch.tensor(opts["alibi_slopes"]),
                          tt, hidden)
    ((o * torch.from_numpy(d_o)).sum() + (lse * torch.from_numpy(g)).sum()).backward()
    for a, t in zip(mine, (tq, tk, tv, tt)):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-10, atol=1e-12)

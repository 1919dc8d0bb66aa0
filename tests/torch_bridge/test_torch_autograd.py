"""Gradients of fastattn.torch.scaled_dot_product_attention: gradcheck in
float64 for each option, opcheck of the forward and backward operators,
torch SDPA's own gradients in float32, bfloat16 and float16 against
float64, and a training step under torch.compile(fullgraph=True)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fastattn.torch needs torch (pip install 'fastattn[torch]')")

import fastattn  # noqa: E402
import fastattn.torch as fat  # noqa: E402
from fastattn.torch import scaled_dot_product_attention as sdpa  # noqa: E402
from torch_common import (assert_same_training, compiled_and_eager,  # noqa: E402
                          skip_without_bfloat16)

F = torch.nn.functional.scaled_dot_product_attention
QS, KS = (1, 2, 5, 4), (1, 2, 7, 4)  # L = 5 queries, S = 7 keys


def _leaves(qs=QS, ks=KS, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
                 for s in (qs, ks, ks))


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


# each: (extra leaves (name -> tensor requiring grad), constant options, q/k shapes)
def _cases():
    g = _gen()
    bool_mask = torch.rand(5, 7, generator=g) > 0.3
    bool_mask[:, 0] = True  # every row sees a key
    return {
        "plain": ({}, {}, QS, KS),
        "bool_mask_broadcast": ({}, {"attn_mask": bool_mask}, QS, KS),
        "additive_mask": ({}, {"attn_mask": torch.randn(1, 2, 5, 7, generator=g,
                                                        dtype=torch.float64)}, QS, KS),
        "causal_upper_left": ({}, {"is_causal": True}, QS, KS),
        "causal_lower_right": ({}, {"is_causal": "lower_right"}, QS, KS),
        "scale": ({}, {"scale": 0.3}, QS, KS),
        "enable_gqa": ({}, {"enable_gqa": True}, (1, 4, 5, 4), KS),
        "broadcast_key_value_heads": ({}, {}, (2, 2, 5, 4), (1, 1, 7, 4)),
        "window": ({}, {"window": (2, 1)}, QS, KS),
        "window_causal_lower_right": ({}, {"window": (3, 0), "is_causal": "lower_right"},
                                      QS, KS),
        "alibi_slopes": ({}, {"alibi_slopes": torch.tensor([0.5, 0.25], dtype=torch.float64)},
                         QS, KS),
        "softcap": ({}, {"softcap": 1.5}, QS, KS),
        "key_padding_mask": ({}, {"key_padding_mask": torch.tensor(
            [[False, True, False, False, True, False, True]])}, QS, KS),
        "sinks_leaf": ({"sinks": torch.tensor([0.3, -1.0], dtype=torch.float64)}, {}, QS, KS),
        "sinks_gqa_window_softcap": ({"sinks": torch.tensor([0.3, -1.0, 2.0, 0.0],
                                                            dtype=torch.float64)},
                                     {"enable_gqa": True, "window": (2, 0), "is_causal": True,
                                      "softcap": 2.0}, (1, 4, 5, 4), KS),
        "learned_bias_leaf": ({"attn_mask": torch.randn(1, 2, 5, 7, generator=g,
                                                        dtype=torch.float64)}, {}, QS, KS),
        "learned_bias_broadcast_causal_softcap": (
            {"attn_mask": torch.randn(5, 7, generator=g, dtype=torch.float64)},
            {"is_causal": "lower_right", "softcap": 1.5}, (2, 2, 5, 4), KS),
        "learned_bias_gqa_window_padding_sinks": (
            {"attn_mask": torch.randn(1, 4, 1, 7, generator=g, dtype=torch.float64),
             "sinks": torch.tensor([0.3, -1.0, 2.0, 0.0], dtype=torch.float64)},
            {"enable_gqa": True, "window": (2, 1), "key_padding_mask": torch.tensor(
                [[False, True, False, False, True, False, False]])}, (1, 4, 5, 4), KS),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_float64(name):
    extra, options, qs, ks = CASES[name]
    leaves = _leaves(qs, ks)
    names = sorted(extra)
    extras = tuple(extra[n].clone().requires_grad_(True) for n in names)

    def f(q, k, v, *xs):
        return sdpa(q, k, v, **options, **dict(zip(names, xs)))

    assert torch.autograd.gradcheck(f, leaves + extras)


def test_gradcheck_float64_with_lse_output():
    q, k, v = _leaves()
    sinks = torch.tensor([0.5, -0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: sdpa(q, k, v, is_causal="lower_right", sinks=s, return_lse=True),
        (q, k, v, sinks))


def test_gradient_of_lse_alone():
    q, k, v = _leaves()
    _, lse = sdpa(q, k, v, return_lse=True)
    lse.sum().backward()
    ref = tuple(x.detach().clone().requires_grad_(True) for x in (q, k, v))
    torch.logsumexp(ref[0] @ ref[1].transpose(-1, -2) / 2.0, -1).sum().backward()
    torch.testing.assert_close(q.grad, ref[0].grad)
    torch.testing.assert_close(k.grad, ref[1].grad)
    assert torch.count_nonzero(v.grad) == 0


def test_sinks_gradient_is_the_extra_key_of_zero_value():
    q, k, v = _leaves()
    sinks = torch.tensor([0.3, -1.0], dtype=torch.float64, requires_grad=True)
    sdpa(q, k, v, sinks=sinks).square().sum().backward()
    s = sinks.detach().clone().requires_grad_(True)
    k2 = torch.cat([k.detach(), torch.zeros(1, 2, 1, 4, dtype=torch.float64)], dim=2)
    v2 = torch.cat([v.detach(), torch.zeros(1, 2, 1, 4, dtype=torch.float64)], dim=2)
    bias = torch.cat([torch.zeros(1, 2, 5, 7, dtype=torch.float64),
                      s.reshape(1, 2, 1, 1).expand(1, 2, 5, 1)], dim=-1)
    F(q.detach(), k2, v2, attn_mask=bias).square().sum().backward()
    assert sinks.grad.dtype == torch.float64 and torch.count_nonzero(sinks.grad) == 2
    torch.testing.assert_close(sinks.grad, s.grad)


def _torch_equivalent(name):
    """(fastattn options, torch SDPA options, q shape, k shape) for float32 parity."""
    i, j = torch.arange(9)[:, None], torch.arange(12)[None, :]
    band = (j <= i + 3) & (j > i + 3 - 4)  # lower-right causal, window (3, 0)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, 8:] = True
    bias = torch.randn(2, 1, 9, 12, generator=_gen(2))
    q4, k4 = (2, 4, 9, 8), (2, 4, 12, 8)
    return {
        "plain": ({}, {}, q4, k4),
        "causal": ({"is_causal": True}, {"is_causal": True}, q4, k4),
        "bool_mask": ({"attn_mask": band}, {"attn_mask": band}, q4, k4),
        "additive_mask": ({"attn_mask": bias}, {"attn_mask": bias}, q4, k4),
        "scale": ({"scale": 0.2}, {"scale": 0.2}, q4, k4),
        "gqa": ({"enable_gqa": True}, {"enable_gqa": True}, q4, (2, 2, 12, 8)),
        "window_lower_right": ({"is_causal": "lower_right", "window": (3, 0)},
                               {"attn_mask": band}, q4, k4),
        "key_padding_mask": ({"key_padding_mask": pad}, {"attn_mask": ~pad[:, None, None, :]},
                             q4, k4),
    }[name]


@pytest.mark.parametrize("name", ["plain", "causal", "bool_mask", "additive_mask", "scale",
                                  "gqa", "window_lower_right", "key_padding_mask"])
def test_float32_gradients_match_torch_sdpa(name):
    ours_opts, torch_opts, qs, ks = _torch_equivalent(name)
    ours = _leaves(qs, ks, torch.float32, seed=3)
    ref = tuple(x.detach().clone().requires_grad_(True) for x in ours)
    w = torch.randn(qs[:-1] + (8,), generator=_gen(4))
    (sdpa(*ours, **ours_opts) * w).sum().backward()
    (F(*ref, **torch_opts) * w).sum().backward()
    for a, b in zip(ours, ref):
        assert a.grad.dtype == torch.float32 and a.grad.shape == a.shape
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5 * b.grad.abs().max())


@pytest.mark.parametrize("shape", [(2, 4, 9, 12), (1, 4, 9, 12), (2, 1, 9, 12), (9, 12), (12,)],
                         ids=["full", "over_batch", "over_heads", "LS", "keys_only"])
def test_learned_bias_gradient_matches_torch_sdpa_float32(shape):
    """A float attn_mask that requires grad (T5's relative position bias):
    its gradient, summed over what it broadcast, as torch's SDPA gives it,
    with -inf entries (zero gradient) and the query, key and value ones."""
    ours = _leaves((2, 4, 9, 8), (2, 4, 12, 8), torch.float32, seed=13)
    bias = torch.randn(shape, generator=_gen(14))
    bias[..., 3] = float("-inf")
    bias = bias.requires_grad_(True)
    ref = tuple(x.detach().clone().requires_grad_(True) for x in ours)
    ref_bias = bias.detach().clone().requires_grad_(True)
    w = torch.randn(2, 4, 9, 8, generator=_gen(15))
    (sdpa(*ours, bias, is_causal="lower_right") * w).sum().backward()
    i, j = torch.arange(9)[:, None], torch.arange(12)[None, :]
    (F(*ref, ref_bias + torch.where(j <= i + 3, 0.0, float("-inf"))) * w).sum().backward()
    assert bias.grad.shape == bias.shape and bias.grad.dtype == torch.float32
    assert torch.count_nonzero(bias.grad[..., 3]) == 0
    for a, b in zip(ours + (bias,), ref + (ref_bias,)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5 * b.grad.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_learned_bias_gradient_near_float64(dtype):
    skip_without_bfloat16(dtype)
    leaves = _leaves((2, 2, 16, 16), (2, 2, 24, 16), dtype, seed=16)
    bias = torch.randn(2, 16, 24, generator=_gen(17)).to(dtype).requires_grad_(True)
    wide = tuple(x.detach().double().requires_grad_(True) for x in leaves)
    wide_bias = bias.detach().double().requires_grad_(True)
    w = torch.randn(2, 2, 16, 16, generator=_gen(18))
    (sdpa(*leaves, bias[:, None], softcap=3.0).float() * w).sum().backward()
    (sdpa(*wide, wide_bias[:, None], softcap=3.0) * w.double()).sum().backward()
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert bias.grad.dtype == dtype and bias.grad.shape == bias.shape
    # float32 arithmetic on the same inputs; the rounded forward output in
    # D, the gradient's own rounding, and a sum of two heads' gradients
    err = (bias.grad.double() - wide_bias.grad).abs().max()
    assert err <= 3 * eps * wide_bias.grad.abs().max(), (err, wide_bias.grad.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_gradients_near_float64(dtype):
    skip_without_bfloat16(dtype)
    leaves = _leaves((2, 2, 16, 16), (2, 2, 24, 16), dtype, seed=5)
    wide = tuple(x.detach().double().requires_grad_(True) for x in leaves)
    w = torch.randn(2, 2, 16, 16, generator=_gen(6))
    (sdpa(*leaves, is_causal="lower_right").float() * w).sum().backward()
    (sdpa(*wide, is_causal="lower_right") * w.double()).sum().backward()
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # the unit roundoff
    for a, b in zip(leaves, wide):
        assert a.grad.dtype == dtype
        err = (a.grad.double() - b.grad).abs().max()
        # float32 arithmetic on the same (rounded) inputs: what is left is the
        # forward output's rounding (it enters the softmax backward) and the
        # gradient's own, about one eps each relative to the largest gradient
        assert err <= 2 * eps * b.grad.abs().max(), (err, b.grad.abs().max())


def _op_args(requires_grad):
    q, k, v = _leaves((2, 4, 5, 8), (2, 2, 7, 8), torch.float32, seed=7)
    mask = torch.rand(2, 1, 5, 7, generator=_gen(8)) > 0.2
    mask[..., 0] = True
    sinks = torch.tensor([0.1, -0.2, 0.3, 1.0], requires_grad=requires_grad)
    if not requires_grad:
        q, k, v = (x.detach() for x in (q, k, v))
    return (q, k, v, mask, "lower_right", 0.5, True, None, 3, -1, None, 2.0, sinks, None)


def test_opcheck_forward_operators_with_autograd():
    args = _op_args(True)
    for op in (torch.ops.fastattn.sdpa.default, torch.ops.fastattn.sdpa_lse.default):
        torch.library.opcheck(op, args)  # includes test_autograd_registration, aot_dispatch


def test_opcheck_backward_operator():
    args = _op_args(False)
    out, lse = torch.ops.fastattn.sdpa_lse(*args)
    g = torch.randn(out.shape, generator=_gen(9))
    for grad_lse in (None, torch.randn(lse.shape, generator=_gen(10))):
        bargs = (g, grad_lse, *args[:3], out, lse, *args[3:], False)
        torch.library.opcheck(torch.ops.fastattn.sdpa_backward.default, bargs)
    no_sinks = args[:12] + (None, None)
    out, lse = torch.ops.fastattn.sdpa_lse(*no_sinks)
    res = torch.ops.fastattn.sdpa_backward(g, None, *no_sinks[:3], out, lse, *no_sinks[3:],
                                           False)
    assert res[3].shape == (0,) and res[4].shape == (0,)
    torch.library.opcheck(torch.ops.fastattn.sdpa_backward.default,
                          (g, None, *no_sinks[:3], out, lse, *no_sinks[3:], False))
    bias = torch.randn(2, 1, 5, 7, generator=_gen(12))
    with_bias = args[:3] + (bias,) + args[4:]
    out, lse = torch.ops.fastattn.sdpa_lse(*with_bias)
    bargs = (g, None, *with_bias[:3], out, lse, *with_bias[3:], True)
    assert torch.ops.fastattn.sdpa_backward(*bargs)[4].shape == bias.shape
    torch.library.opcheck(torch.ops.fastattn.sdpa_backward.default, bargs)


def test_backward_operator_is_attention_backward():
    args = _op_args(False)
    out, lse = torch.ops.fastattn.sdpa_lse(*args)
    g = torch.randn(out.shape, generator=_gen(11))
    got = torch.ops.fastattn.sdpa_backward(g, None, *args[:3], out, lse, *args[3:], False)
    assert got[4].shape == (0,)
    got = got[:4]
    q, k, v = (x.numpy() for x in args[:3])
    want = fastattn.attention_backward(g.numpy(), q, k, v, out.numpy(), lse.numpy(),
                                       args[3].numpy(), "lower_right", 0.5, True, window=(3, None),
                                       softcap=2.0, sinks=args[12].numpy())
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), b)


def test_plain_operator_backward_matches_the_public_function():
    args = _op_args(True)
    torch.ops.fastattn.sdpa(*args).sum().backward()
    grads = [x.grad.clone() for x in (args[0], args[1], args[2], args[12])]
    for x in (args[0], args[1], args[2], args[12]):
        x.grad = None
    sdpa(*args[:3], args[3], is_causal="lower_right", scale=0.5, enable_gqa=True,
         window=(3, None), softcap=2.0, sinks=args[12]).sum().backward()
    for a, x in zip(grads, (args[0], args[1], args[2], args[12])):
        torch.testing.assert_close(a, x.grad, rtol=0, atol=0)


def test_no_grad_call_takes_the_direct_path(monkeypatch):
    q, k, v = _leaves(dtype=torch.float32)

    def refuse(*a, **kw):
        raise AssertionError("the operator path was taken")

    monkeypatch.setattr(fat, "_traced", refuse)
    with torch.no_grad():
        assert sdpa(q, k, v, sinks=torch.zeros(2)).grad_fn is None
    plain = tuple(x.detach() for x in (q, k, v))
    assert sdpa(*plain, return_lse=True)[1].grad_fn is None  # grad mode on, nothing requires grad


def test_learned_keys_held_as_parameters_train_and_infer():
    # parameters (a Tensor subclass) reach the operators through the
    # dispatcher, whose implementation must not send them back there
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64)
    keys = torch.nn.Parameter(torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64))
    latents = torch.nn.Parameter(torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64))
    out = sdpa(q, keys, latents)
    out.sum().backward()
    k2, v2 = keys.detach().clone().requires_grad_(), latents.detach().clone().requires_grad_()
    ref = F(q, k2, v2)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(keys.grad, k2.grad)
    torch.testing.assert_close(latents.grad, v2.grad)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(q, keys, latents), ref)


def test_out_argument_is_differentiable():
    q, k, v = _leaves(dtype=torch.float32)
    out = torch.empty(1, 2, 5, 4)
    r = sdpa(q, k, v, out=out)
    assert r is out
    r.sum().backward()
    ref = tuple(x.detach().clone().requires_grad_(True) for x in (q, k, v))
    F(*ref).sum().backward()
    torch.testing.assert_close(q.grad, ref[0].grad)


def test_out_of_another_shape_or_dtype_is_refused_when_training():
    q, k, v = _leaves(dtype=torch.float32)
    for out, err, match in ((torch.full((1, 2, 5, 3), 7.0), ValueError,
                             r"out has shape \(1, 2, 5, 3\), the result has shape \(1, 2, 5, 4\)"),
                            (torch.full((1, 2, 5, 4), 7.0, dtype=torch.float64), TypeError,
                             "out has dtype torch.float64, the result has dtype torch.float32")):
        with pytest.raises(err, match=match):
            sdpa(q, k, v, out=out)
        assert bool((out == 7.0).all())  # nothing written


@pytest.mark.parametrize("E,Ev", [(0, 3), (4, 0)], ids=["E0", "Ev0"])
def test_empty_feature_axes_match_torch_sdpa_gradients(E, Ev):
    g = _gen()
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64).requires_grad_(True)
               for s in ((2, 5, E), (2, 7, E), (2, 7, Ev)))
    (sdpa(q, k, v, is_causal=True).sum() + q.sum()).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (F(q, k, v, is_causal=True).sum() + q.sum()).backward()
    for a, t in zip(got, (q, k, v)):
        torch.testing.assert_close(a, t.grad, atol=1e-12, rtol=0)


def test_bfloat16_sinks_get_a_bfloat16_gradient():
    """A bfloat16 model's sinks parameter (gpt-oss's s_aux): the same
    gradient as its float64 copy, rounded once."""
    q, k, v = _leaves(dtype=torch.bfloat16)
    sinks = torch.tensor([0.5, -1.0], dtype=torch.bfloat16, requires_grad=True)
    sdpa(q, k, v, sinks=sinks).float().sum().backward()
    assert sinks.grad.dtype == torch.bfloat16
    s64 = sinks.detach().double().requires_grad_(True)
    sdpa(q.detach().double(), k.detach().double(), v.detach().double(), sinks=s64).sum().backward()
    torch.testing.assert_close(sinks.grad.double(), s64.grad, atol=2e-2, rtol=2e-2)


def test_zero_dim_sinks_get_a_zero_dim_gradient_as_their_broadcast_copy():
    """One sink shared by every head, as a 0-d tensor: its gradient is the
    sum of the heads' (autograd's rule), a 0-d tensor."""
    q, k, v = _leaves()
    sink = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    sdpa(q, k, v, sinks=sink).sum().backward()
    wide = torch.tensor([0.5, 0.5], dtype=torch.float64, requires_grad=True)
    sdpa(q.detach(), k.detach(), v.detach(), sinks=wide).sum().backward()
    assert sink.grad.shape == ()
    torch.testing.assert_close(sink.grad, wide.grad.sum(), atol=1e-12, rtol=0)
    cu = torch.tensor([0, 2, 5])
    qv = torch.randn(5, 2, 4, dtype=torch.float64)
    sink.grad = None
    fat.attention_varlen(qv, qv, qv, cu, cu, sinks=sink).sum().backward()
    assert sink.grad.shape == () and bool(torch.isfinite(sink.grad))


def test_sinks_as_a_sequence_are_a_constant():
    q, k, v = _leaves(dtype=torch.float32)
    sdpa(q, k, v, sinks=[0.3, -1.0]).sum().backward()
    ref = tuple(x.detach().clone().requires_grad_(True) for x in (q, k, v))
    sdpa(*ref, sinks=torch.tensor([0.3, -1.0])).sum().backward()
    for a, b in zip((q, k, v), ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_second_order_gradients_are_a_clear_error():
    q, k, v = _leaves()
    (dq,) = torch.autograd.grad(sdpa(q, k, v).sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="first derivatives only.*MATH"):
        dq.sum().backward()


def test_out_as_a_numpy_array_is_refused_with_and_without_grad():
    # the result is a tensor on every path, so an array out= is refused on each
    q, k, v = _leaves(dtype=torch.float32)
    for args in ((q, k, v), tuple(x.detach() for x in (q, k, v))):
        out = np.full(tuple(q.shape[:-1]) + (v.shape[-1],), 7.0, np.float32)
        with pytest.raises(TypeError, match="out must be a torch.Tensor, got ndarray"):
            sdpa(*args, out=out)
        assert bool((out == 7.0).all())


def test_dropout_is_still_refused_when_training():
    q, k, v = _leaves(dtype=torch.float32)
    with pytest.raises(ValueError, match="dropout_p=0.5.*no dropout"):
        sdpa(q, k, v, dropout_p=0.5)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 24)
        self.sinks = torch.nn.Parameter(torch.tensor([0.5, -0.5]))

    def forward(self, x):
        q, k, v = self.proj(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        y = sdpa(q, k, v, is_causal=True, window=(3, 0), sinks=self.sinks)
        return y.square().mean()


def test_training_step_compiles_in_one_graph_and_matches_eager():
    want, got, seen = compiled_and_eager(_Tiny, (torch.randn(2, 6, 8, generator=_gen(0)),))
    assert any("fastattn.sdpa_lse.default" in s for s in seen)
    assert any("fastattn.sdpa_backward.default" in s for s in seen)
    assert_same_training(got, want, {"sinks", "proj.weight", "proj.bias"})
    assert torch.count_nonzero(got[1][0]["sinks"]) == 2  # the sinks get a gradient


class _Biased(torch.nn.Module):
    """Attention with a learned relative-position bias per head, as T5's."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 24)
        self.rel = torch.nn.Embedding(11, 2)

    def forward(self, x):
        q, k, v = self.proj(x).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4)
        i = torch.arange(x.shape[1])
        bias = self.rel((i[None, :] - i[:, None]).clamp(-5, 5) + 5).permute(2, 0, 1)
        return sdpa(q, k, v, bias, is_causal=True).square().mean()


def test_learned_bias_training_step_compiles_in_one_graph_and_matches_eager():
    want, got, seen = compiled_and_eager(_Biased, (torch.randn(2, 6, 8, generator=_gen(0)),))
    assert any("fastattn.sdpa_backward.default" in s for s in seen)
    assert_same_training(got, want, {"rel.weight", "proj.weight", "proj.bias"})
    assert torch.count_nonzero(got[1][0]["rel.weight"]) > 0  # the bias gets a gradient


@pytest.mark.parametrize("where", ["query", "key"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_nan_or_inf_in_the_inputs_gives_nan_gradients_as_torch(where, is_causal):
    """A forward whose lse is not finite (NaN or Inf in Q or K): the backward
    carries NaN into the gradients, as torch's own kernels do, where NumPy's
    attention_backward refuses that lse; every gradient torch makes NaN is NaN."""
    g = torch.Generator().manual_seed(0)
    base = {n: torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for n in ("q", "k", "v")}
    base["q" if where == "query" else "k"][0, 1, 3, 2] = float("nan")
    ours = {n: t.clone().requires_grad_(True) for n, t in base.items()}
    ref = {n: t.clone().requires_grad_(True) for n, t in base.items()}
    sdpa(ours["q"], ours["k"], ours["v"], is_causal=is_causal).sum().backward()
    torch.nn.functional.scaled_dot_product_attention(
        ref["q"], ref["k"], ref["v"], is_causal=is_causal).sum().backward()
    for n in ("q", "k", "v"):
        theirs = torch.isnan(ref[n].grad)
        assert theirs.any() and torch.isnan(ours[n].grad)[theirs].all(), n


def test_nan_in_packed_inputs_gives_nan_gradients():
    q = torch.randn(6, 2, 4, dtype=torch.float64)
    k = torch.randn(6, 2, 4, dtype=torch.float64)
    k[4, 0, 1] = float("nan")
    q.requires_grad_(True), k.requires_grad_(True)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    fat.attention_varlen(q, k, k, cu, cu).sum().backward()
    assert torch.isnan(q.grad[3:]).all() and torch.isnan(k.grad[3:]).all()


@pytest.mark.parametrize("scale", ["1", True])
def test_scale_as_text_or_bool_is_refused_with_and_without_grad(scale):
    q = torch.randn(1, 3, 4)
    for x in (q, q.clone().requires_grad_(True)):
        with pytest.raises(TypeError, match="scale must be a real number"):
            sdpa(x, q, q, scale=scale)

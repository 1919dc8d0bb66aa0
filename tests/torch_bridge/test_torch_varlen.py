"""fastattn.torch.attention_varlen: packed sequences of tensors, against the
NumPy function (bitwise) and per-sequence torch SDPA; gradcheck in float64
for each option, opcheck of both operators, 16-bit gradients, bad input,
and a packed-sequence training step under torch.compile(fullgraph=True)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="fastattn.torch needs torch (pip install 'fastattn[torch]')")

import fastattn  # noqa: E402
import fastattn._torch_varlen as tv  # noqa: E402
from fastattn import _torch_views as views  # noqa: E402
from fastattn.torch import attention_varlen  # noqa: E402
from torch_common import (assert_same_training, compiled_and_eager,  # noqa: E402
                          skip_without_bfloat16)

F = torch.nn.functional.scaled_dot_product_attention
CU_Q = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # the middle sequence has no queries
CU_K = torch.tensor([0, 3, 4, 8], dtype=torch.int32)


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def _leaves(h=2, h_kv=2, dtype=torch.float64, seed=0, e=4):
    g = _gen(seed)
    shapes = ((int(CU_Q[-1]), h, e), (int(CU_K[-1]), h_kv, e), (int(CU_K[-1]), h_kv, e))
    return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
                 for s in shapes)


# each: (extra leaves requiring grad, constant options, query heads, kv heads)
CASES = {
    "plain": ({}, {}, 2, 2),
    "causal_upper_left": ({}, {"is_causal": True}, 2, 2),
    "causal_lower_right": ({}, {"is_causal": "lower_right"}, 2, 2),
    "scale": ({}, {"scale": 0.3}, 2, 2),
    "grouped_query_heads": ({}, {}, 4, 2),
    "window": ({}, {"window": (1, 1)}, 2, 2),
    "alibi_slopes_per_sequence": ({}, {"alibi_slopes": torch.tensor(
        [[0.5, 0.25], [0.1, 0.2], [1.0, 0.0]], dtype=torch.float64)}, 2, 2),
    "softcap": ({}, {"softcap": 1.5}, 2, 2),
    "sinks_leaf": ({"sinks": torch.tensor([0.3, -1.0], dtype=torch.float64)}, {}, 2, 2),
    "sinks_per_sequence_gqa_window_softcap": (
        {"sinks": torch.tensor([[0.3, -1.0, 2.0, 0.0]] * 3, dtype=torch.float64)},
        {"is_causal": "lower_right", "window": (1, 0), "softcap": 2.0}, 4, 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_float64(name):
    extra, options, h, h_kv = CASES[name]
    leaves = _leaves(h, h_kv)
    names = sorted(extra)
    extras = tuple(extra[n].clone().requires_grad_(True) for n in names)

    def f(q, k, v, *xs):
        return attention_varlen(q, k, v, CU_Q, CU_K, **options, **dict(zip(names, xs)))

    assert torch.autograd.gradcheck(f, leaves + extras)


def test_gradcheck_float64_through_lse():
    q, k, v = _leaves()
    sinks = torch.tensor([0.5, -0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: attention_varlen(q, k, v, CU_Q, CU_K, is_causal="lower_right",
                                            sinks=s, return_lse=True), (q, k, v, sinks))


def _per_sequence_sdpa(q, k, v, cu_q, cu_k, **options):
    outs = []
    for b in range(len(cu_q) - 1):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if rows.start == rows.stop:
            continue
        qs, ks, vs = (x.transpose(0, 1) for x in (q[rows], k[keys], v[keys]))
        outs.append(F(qs, ks, vs, **options).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("gqa", [False, True], ids=["heads", "grouped_query_heads"])
def test_float32_values_and_gradients_match_per_sequence_torch_sdpa(gqa):
    g = _gen(3)
    ours = tuple(torch.randn(s, generator=g).requires_grad_(True)
                 for s in ((9, 4 if gqa else 2, 8), (9, 2, 8), (9, 2, 8)))
    ref = tuple(x.detach().clone().requires_grad_(True) for x in ours)
    cu = torch.tensor([0, 3, 3, 9], dtype=torch.int64)
    out = attention_varlen(*ours, cu, cu, is_causal=True)
    want = _per_sequence_sdpa(*ref, cu, cu, is_causal=True, enable_gqa=gqa)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    w = torch.randn(out.shape, generator=_gen(4))
    (out * w).sum().backward()
    (want * w).sum().backward()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5 * float(b.grad.abs().max()))


def test_forward_and_gradients_are_those_of_the_numpy_functions_bitwise():
    q, k, v = _leaves(4, 2, torch.float32, seed=5)
    sinks = torch.tensor([0.2, -0.3, 0.0, 1.0], requires_grad=True)
    opts = dict(is_causal="lower_right", window=(2, None), softcap=3.0)
    out, lse = attention_varlen(q, k, v, CU_Q, CU_K, sinks=sinks, return_lse=True, **opts)
    a = [x.detach().numpy() for x in (q, k, v)]
    want, want_lse = fastattn.attention_varlen(*a, CU_Q.numpy(), CU_K.numpy(), return_lse=True,
                                               sinks=sinks.detach().numpy(), **opts)
    np.testing.assert_array_equal(out.detach().numpy(), want)
    np.testing.assert_array_equal(lse.detach().numpy(), want_lse)
    g = torch.randn(out.shape, generator=_gen(6))
    g_lse = torch.randn(lse.shape, generator=_gen(7))
    torch.autograd.backward((out, lse), (g, g_lse))
    grads = fastattn.attention_varlen_backward(
        g.numpy(), *a, want, want_lse, CU_Q.numpy(), CU_K.numpy(),
        sinks=sinks.detach().numpy(), grad_lse=g_lse.numpy(), **opts)
    for t, w in zip((q, k, v, sinks), grads):
        np.testing.assert_array_equal(t.grad.numpy(), w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_inputs_read_in_place_and_gradients_in_their_dtype(dtype):
    skip_without_bfloat16(dtype)
    leaves = _leaves(4, 2, dtype, seed=8, e=16)
    wide = tuple(x.detach().double().requires_grad_(True) for x in leaves)
    w = torch.randn(int(CU_Q[-1]), 4, 16, generator=_gen(9))
    out = attention_varlen(*leaves, CU_Q, CU_K, is_causal="lower_right")
    assert out.dtype == dtype
    (out.float() * w).sum().backward()
    (attention_varlen(*wide, CU_Q, CU_K, is_causal="lower_right") * w.double()).sum().backward()
    eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # the unit roundoff
    for a, b in zip(leaves, wide):
        assert a.grad.dtype == dtype and a.grad.shape == a.shape
        # the float32 gradient's error (a few units of eps) plus its rounding
        err = float((a.grad.double() - b.grad).abs().max())
        assert err <= 8 * eps * float(b.grad.abs().max()) + 1e-6


def _op_args(grad):
    q, k, v = _leaves(4, 2, seed=11)
    if not grad:
        q, k, v = (x.detach() for x in (q, k, v))
    sinks = torch.tensor([0.2, -0.3, 0.0, 1.0], dtype=torch.float64, requires_grad=grad)
    return (q, k, v, CU_Q, CU_K, "lower_right", 0.5, 2, -1, None, 2.0, sinks, None)


def test_opcheck_forward_operator_with_autograd():
    torch.library.opcheck(torch.ops.fastattn.varlen.default, _op_args(True))


def test_opcheck_backward_operator():
    args = _op_args(False)
    out, lse = torch.ops.fastattn.varlen(*args)
    g = torch.randn(out.shape, generator=_gen(12), dtype=torch.float64)
    for grad_lse in (None, torch.randn(lse.shape, generator=_gen(13), dtype=torch.float64)):
        torch.library.opcheck(torch.ops.fastattn.varlen_backward.default,
                              (g, grad_lse, *args[:3], out, lse, *args[3:]))
    no_sinks = args[:11] + (None, None)
    out, lse = torch.ops.fastattn.varlen(*no_sinks)
    res = torch.ops.fastattn.varlen_backward(g, None, *no_sinks[:3], out, lse, *no_sinks[3:])
    assert res[3].shape == (0,)


def test_no_grad_call_takes_the_direct_path(monkeypatch):
    q, k, v = (x.detach() for x in _leaves(dtype=torch.float32))

    def refuse(*a, **kw):
        raise AssertionError("the operator path was taken")

    monkeypatch.setattr(tv, "_traced", refuse)
    out, lse = attention_varlen(q, k, v, CU_Q, CU_K, return_lse=True)
    assert out.grad_fn is None and lse.grad_fn is None
    with torch.no_grad():
        assert attention_varlen(*_leaves(dtype=torch.float32), CU_Q, CU_K).grad_fn is None


def test_inputs_are_read_in_place_and_out_is_filled():
    q, k, v = (x.detach() for x in _leaves(2, 2, torch.float32, seed=14))
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)  # heads-first memory
    assert not qt.is_contiguous()
    view = views.array_view(qt, "query")
    assert view.ctypes.data == qt.data_ptr()
    out = torch.empty(int(CU_Q[-1]), 2, 4)
    assert attention_varlen(qt, k, v, CU_Q, CU_K, out=out) is out
    torch.testing.assert_close(out, attention_varlen(q, k, v, CU_Q, CU_K), rtol=0, atol=0)


def test_out_written_eagerly_moves_its_version_and_one_requiring_grad_is_refused():
    q, k, v = (x.detach() for x in _leaves(2, 2, torch.float32, seed=16))
    out = torch.empty(int(CU_Q[-1]), 2, 4)
    attention_varlen(q, k, v, CU_Q, CU_K, out=out)
    assert out._version > 0
    with pytest.raises(ValueError, match="out requires grad"):
        attention_varlen(q, k, v, CU_Q, CU_K, out=out.clone().requires_grad_(True))


def test_out_argument_is_differentiable():
    q, k, v = _leaves(dtype=torch.float32, seed=15)
    out = torch.empty(int(CU_Q[-1]), 2, 4)
    r = attention_varlen(q, k, v, CU_Q, CU_K, out=out)
    assert r is out
    r.sum().backward()
    ref = tuple(x.detach().clone().requires_grad_(True) for x in (q, k, v))
    attention_varlen(*ref, CU_Q, CU_K).sum().backward()
    torch.testing.assert_close(q.grad, ref[0].grad, rtol=0, atol=0)


def test_out_of_another_shape_is_refused_with_and_without_grad():
    q, k, v = _leaves(dtype=torch.float32, seed=18)
    for args in ((q, k, v), tuple(x.detach() for x in (q, k, v))):
        out = torch.full((int(CU_Q[-1]), 2, 3), 7.0)
        with pytest.raises(ValueError, match=r"out has shape \(5, 2, 3\), the result has shape"):
            attention_varlen(*args, CU_Q, CU_K, out=out)
        assert bool((out == 7.0).all())


def test_out_as_a_numpy_array_is_refused_with_and_without_grad():
    # the torch functions return tensors: an array out= is refused on both
    # paths, before anything is written
    q, k, v = _leaves(dtype=torch.float32, seed=19)
    for args in ((q, k, v), tuple(x.detach() for x in (q, k, v))):
        out = np.full((int(CU_Q[-1]), 2, 4), 7.0, np.float32)
        with pytest.raises(TypeError, match="out must be a torch.Tensor, got ndarray"):
            attention_varlen(*args, CU_Q, CU_K, out=out)
        assert bool((out == 7.0).all())


def test_second_order_gradients_are_a_clear_error():
    q, k, v = _leaves(seed=20)
    (dq,) = torch.autograd.grad(attention_varlen(q, k, v, CU_Q, CU_K).sum(), q,
                                create_graph=True)
    with pytest.raises(NotImplementedError, match="first derivatives only.*MATH"):
        dq.sum().backward()


def test_offsets_given_as_lists_when_training():
    q, k, v = _leaves(dtype=torch.float32, seed=16)
    attention_varlen(q, k, v, [0, 2, 2, 5], [0, 3, 4, 8]).sum().backward()
    ref = tuple(x.detach().clone().requires_grad_(True) for x in (q, k, v))
    attention_varlen(*ref, CU_Q, CU_K).sum().backward()
    torch.testing.assert_close(k.grad, ref[1].grad, rtol=0, atol=0)


def test_bad_offsets_are_named_with_and_without_grad():
    q, k, v = _leaves(dtype=torch.float32)
    bad = torch.tensor([0, 2, 9], dtype=torch.int32)
    for args in ((q, k, v), tuple(x.detach() for x in (q, k, v))):
        with pytest.raises(ValueError, match="cu_seqlens_k"):
            attention_varlen(*args, CU_Q[[0, 1, 3]], bad)
    with pytest.raises(ValueError, match="cu_seqlens_q.*int"):
        attention_varlen(q, k, v, [0.0, 2.0, 2.0, 5.0], CU_K)


def test_slopes_requiring_grad_and_non_tensors_are_refused():
    q, k, v = _leaves(dtype=torch.float32)
    with pytest.raises(ValueError, match="alibi_slopes requires grad"):
        attention_varlen(q, k, v, CU_Q, CU_K,
                         alibi_slopes=torch.tensor([0.5, 0.25], requires_grad=True))
    with pytest.raises(TypeError, match="key must be a torch.Tensor.*fastattn.attention_varlen"):
        attention_varlen(q.detach(), k.detach().numpy(), v.detach(), CU_Q, CU_K)


class _PackedTiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 24)
        self.sinks = torch.nn.Parameter(torch.tensor([0.5, -0.5]))

    def forward(self, x, cu):
        q, k, v = self.proj(x).unflatten(-1, (3, 2, 4)).unbind(1)
        q = torch.cat([q, 2 * q], dim=1)  # 4 query heads on 2 kv heads
        y = attention_varlen(q, k, v, cu, cu, is_causal=True, window=(3, 0),
                             sinks=self.sinks.repeat(2))
        return y.square().mean()


def test_packed_training_step_compiles_in_one_graph_and_matches_eager():
    x = torch.randn(11, 8, generator=_gen(0))
    cu = torch.tensor([0, 4, 5, 11], dtype=torch.int32)
    want, got, seen = compiled_and_eager(_PackedTiny, (x, cu))
    assert any("fastattn.varlen.default" in s for s in seen)
    assert any("fastattn.varlen_backward.default" in s for s in seen)
    assert_same_training(got, want, {"sinks", "proj.weight", "proj.bias"})
    assert torch.count_nonzero(got[1][0]["sinks"]) == 2


class _PackedBlock(torch.nn.Module):
    def forward(self, q, k, v, cu):
        y = attention_varlen(q, k, v, cu, cu, is_causal=True, window=(2, 0))
        o, lse = attention_varlen(q, k, v, cu, cu, softcap=3.0, return_lse=True)
        return torch.relu(y) + o * lse.transpose(0, 1)[..., None]


def test_export_holds_the_varlen_operator():
    q, k, v = (x.detach().float() for x in _leaves(4, 2, seed=17))
    q, k, v = q[:5], k[:5], v[:5]  # cu_seqlens over 5 rows
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    ep = torch.export.export(_PackedBlock(), (q, k, v, cu))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("fastattn.varlen.default") == 2
    torch.testing.assert_close(ep.module()(q, k, v, cu), _PackedBlock()(q, k, v, cu),
                               rtol=0, atol=0)


def test_a_window_beyond_int64_when_training_is_unbounded_as_without_grad():
    # the operator's int schema refused it: a RuntimeError naming no argument
    q, k, v = torch.randn(5, 2, 4), torch.randn(8, 1, 4), torch.randn(8, 1, 4)
    want = attention_varlen(q, k, v, CU_Q, CU_K, window=(2**70, 0))
    got = attention_varlen(q.clone().requires_grad_(True), k, v, CU_Q, CU_K, window=(2**70, 0))
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["query", "key"])
def test_out_overlapping_an_input_when_training_is_refused_naming_it(name):
    # without grad the NumPy check refuses it; with grad out was written over
    # the input autograd had saved
    mem = torch.randn(64)
    q = mem[:40].view(5, 2, 4) if name == "query" else torch.randn(5, 2, 4)
    k = mem[:32].view(8, 1, 4) if name == "key" else torch.randn(8, 1, 4)
    out = mem[24:64].view(5, 2, 4)
    before = mem.clone()
    with pytest.raises(ValueError, match=f"out overlaps {name}"):
        attention_varlen(q.requires_grad_(True), k, torch.randn(8, 1, 4), CU_Q, CU_K, out=out)
    assert torch.equal(mem, before)

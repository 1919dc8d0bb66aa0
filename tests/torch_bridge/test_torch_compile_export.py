"""The fastattn::sdpa custom operator: schema and fake implementation checked
by torch.library.opcheck, traced whole by torch.compile and torch.export."""

import pytest

torch = pytest.importorskip("torch", reason="fastattn.torch needs torch (pip install 'fastattn[torch]')")

from fastattn.torch import scaled_dot_product_attention as sdpa  # noqa: E402

F = torch.nn.functional.scaled_dot_product_attention


def _qkv():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, 7, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g),
            torch.randn(2, 2, 9, 8, generator=g))


def test_opcheck_passes_for_both_operators():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 7, 9) > 0.2
    args = (q, k, v, mask, "lower_right", 0.5, True, None, 3, -1, None, 2.0,
            torch.zeros(4), None)
    torch.library.opcheck(torch.ops.fastattn.sdpa.default, args)
    torch.library.opcheck(torch.ops.fastattn.sdpa_lse.default, args)


class _Block(torch.nn.Module):
    def forward(self, q, k, v):
        y = sdpa(q, k, v, is_causal=True, enable_gqa=True, window=(4, 0))
        o, lse = sdpa(q, k, v, enable_gqa=True, return_lse=True, softcap=3.0)
        return torch.relu(y) + o * lse[..., None]


def test_compiles_in_one_graph():
    q, k, v = _qkv()
    torch._dynamo.reset()
    f = torch.compile(_Block(), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(f(q, k, v), _Block()(q, k, v))


def test_export_holds_the_custom_operator():
    q, k, v = _qkv()
    ep = torch.export.export(_Block(), (q, k, v))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "fastattn.sdpa.default" in targets and "fastattn.sdpa_lse.default" in targets
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(q, k, v), _Block()(q, k, v))


def test_compiled_out_argument_is_filled():
    q, k, v = _qkv()

    def fn(q, k, v, out):
        return sdpa(q, k, v, enable_gqa=True, out=out)

    torch._dynamo.reset()
    f = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = torch.empty(2, 4, 7, 8)
    f(q, k, v, out)
    torch.testing.assert_close(out, F(q, k, v, enable_gqa=True))


def test_compiled_out_argument_with_shapes_that_change_is_filled():
    # dynamic shapes: out's strides are symbolic while tracing (the element
    # overlap check cannot sort them there)
    _, k, v = _qkv()

    def fn(q, k, v, out):
        return sdpa(q, k, v, enable_gqa=True, out=out)

    torch._dynamo.reset()
    f = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for L in (3, 5, 6):
        q = torch.randn(2, 4, L, 8)
        out = torch.empty(2, 4, L, 8)
        f(q, k, v, out)
        torch.testing.assert_close(out, F(q, k, v, enable_gqa=True))

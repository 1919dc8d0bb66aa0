"""Shared by the torch bridge's tests: a training step compiled in one graph
next to the same step run eagerly (needs torch; imported by test modules
that skip without it)."""

import pytest
import torch


def skip_without_bfloat16(dtype):
    """Skip a bfloat16 case where this fastattn build does not compute with it."""
    from fastattn import _torch_views
    if dtype == torch.bfloat16:
        try:
            _torch_views.bfloat16_dtype("query")
        except TypeError:
            pytest.skip("this fastattn build does not compute with bfloat16")


def train(model, step, args, n=3):
    """n SGD steps of ``step(*args)``'s loss: (losses, each step's gradients)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], []
    for _ in range(n):
        opt.zero_grad()
        loss = step(*args)
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        opt.step()
    return losses, grads


def compiled_and_eager(make, args):
    """Two models from ``make()`` with the same weights, trained eagerly and
    under torch.compile(fullgraph=True): (eager run, compiled run, the set of
    operator names of each graph compiled)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(0)
    eager = make()
    compiled = make()
    compiled.load_state_dict(eager.state_dict())
    seen = []

    def record(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    step = torch.compile(compiled, fullgraph=True,
                         backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    return train(eager, eager, args), train(compiled, step, args), seen


def assert_same_training(got, want, params):
    """Equal losses and gradients, every step, of the parameters named."""
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b)
    for ga, gb in zip(got[1], want[1]):
        assert ga.keys() == gb.keys() == set(params)
        for name in ga:
            torch.testing.assert_close(ga[name], gb[name])

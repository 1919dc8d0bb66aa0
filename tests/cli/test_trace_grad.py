"""fastattn.trace.trace_backward and ``python -m fastattn trace --grad``.

The walkthrough gives no backward numbers; its forward ones (the weights
0.40/0.20/0.40, ... and the output) are checked where the backward reads
them, and every gradient against fastattn.reference.attention_backward.
"""

import json
import math

import numpy as np
import pytest

from fastattn import reference
from fastattn.trace import GRAD_KEYS, main, trace, trace_backward

W_WALKTHROUGH = np.array([[0.40, 0.20, 0.40], [0.20, 0.40, 0.40], [0.25, 0.25, 0.50]])
OUT_WALKTHROUGH = np.array([[0.80, 0.60], [0.60, 0.80], [0.75, 0.75]])


def reference_grads(t, d_o, **kw):
    """dQ, dK, dV (and d_sink) of the traced head from the reference."""
    q, k, v = (t[key][None] for key in ("Q", "K", "V"))
    out, _, lse = reference.attention(q, k, v, scale=float(t["scale"]), return_weights=True,
                                      return_lse=True, **kw)
    return [np.squeeze(g) for g in reference.attention_backward(
        d_o[None], q, k, v, out, lse, scale=float(t["scale"]), **kw)]


def has_row(out, values):
    """Whether a printed matrix row (a token's name, then the numbers) shows
    ``values`` to 2 decimals."""
    want = [f"{round(float(x), 2) + 0.0:.2f}" for x in values]
    return any(line.split()[1:] == want for line in out.splitlines())


def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_walkthrough_backward_steps_with_ones():
    t = trace()
    np.testing.assert_allclose(t["weights"], W_WALKTHROUGH, atol=5e-3)   # the text's numbers
    np.testing.assert_allclose(t["output"], OUT_WALKTHROUGH, atol=5e-3)
    g = trace_backward(t)
    assert [k for k in GRAD_KEYS if k in g] == ["dO", "dV", "dP", "D", "dS", "dQ", "dK"]
    p, v, o = t["weights"], t["V"], t["output"]
    np.testing.assert_array_equal(g["dO"], np.ones((3, 2)))
    np.testing.assert_allclose(g["dV"], np.repeat(p.sum(axis=0)[:, None], 2, axis=1))
    np.testing.assert_allclose(g["dP"], np.tile(v.sum(axis=1), (3, 1)))   # [1, 1, 2] per row
    np.testing.assert_allclose(g["D"][:, 0], o.sum(axis=1))
    np.testing.assert_allclose(g["dS"].sum(axis=1), 0.0, atol=1e-15)      # rows of P sum to 1
    dq, dk, dv = reference_grads(t, g["dO"])
    np.testing.assert_allclose(g["dQ"], dq, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g["dK"], dk, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(g["dV"], dv, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kwargs, ref_kw", [
    ({"is_causal": True}, {"is_causal": True}),
    ({"softcap": 1.5}, {"softcap": 1.5}),
    ({"alibi": 0.5, "window": (1, 0)}, {"alibi_slopes": [0.5], "window": (1, 0)}),
    ({"sink": 0.25, "is_causal": True}, {"sinks": [0.25], "is_causal": True}),
])
def test_variants_backward_equal_reference(kwargs, ref_kw):
    t = trace(**kwargs)
    d_o = np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0]])
    g = trace_backward(t, d_o)
    want = reference_grads(t, d_o, **ref_kw)
    got = [g["dQ"], g["dK"], g["dV"]] + ([g["d_sink"]] if "sink" in kwargs else [])
    assert len(want) == len(got)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert ("dS_cap" in g) == ("softcap" in kwargs)


def test_grad_out_of_the_wrong_shape_is_a_value_error():
    with pytest.raises(ValueError, match=r"grad_out must have the output's shape \(3, 2\)"):
        trace_backward(trace(), np.ones((2, 3)))


def test_main_grad_prints_the_steps_and_their_agreement(capsys):
    code, out, err = run_main(capsys, "--grad")
    assert code == 0 and err == ""
    steps = ["output = weights V", "dO, the gradient", "dV = P^T dO", "dP = dO V^T",
             "D = rowsum(dO * O)", "dS = P * (dP - D)", "dQ = dS K * scale",
             "dK = dS^T Q * scale", "check: fastattn.attention_backward"]
    positions = [out.index(s) for s in steps]
    assert positions == sorted(positions)
    g = trace_backward(trace())
    for key in ("dV", "dQ", "dK"):              # the printed rows are the reference's
        for row in g[key]:
            assert has_row(out, row), key
    line = next(s for s in out.splitlines() if s.startswith("check:"))
    figures = [float(w.rstrip(",")) for w in line.split() if "e-" in w or "e+" in w]
    assert len(figures) == 2 and max(figures) < 1e-12


def test_main_grad_out_option(capsys):
    code, out, _ = run_main(capsys, "--grad-out", "1,0;0,0;0,1")
    assert code == 0
    g = trace_backward(trace(), [[1, 0], [0, 0], [0, 1]])
    assert "given with --grad-out" in out
    for row in g["dQ"]:
        assert has_row(out, row)


def test_main_grad_out_bad_shape_exits_2(capsys):
    code, out, err = run_main(capsys, "--grad-out", "1,0")
    assert code == 2 and out == ""
    assert "--grad-out" in err and "(3, 2)" in err


def test_main_grad_json_has_the_gradients(capsys):
    code, out, _ = run_main(capsys, "--grad", "--json")
    assert code == 0
    doc = json.loads(out)
    g = trace_backward(trace())
    for key in ("dO", "dV", "dP", "D", "dS", "dQ", "dK"):
        np.testing.assert_allclose(doc[key], g[key], rtol=1e-15)
    assert max(doc["grad_check"].values()) < 1e-12
    assert "scale_comparison" not in doc


def test_unscaled_softmax_saturates_and_its_gradients_shrink(capsys):
    """The walkthrough: without 1/sqrt(d_k) "gradients shrink toward zero"."""
    code, out, _ = run_main(capsys, "--random", "8,64", "--scale", "1", "--grad", "--json")
    assert code == 0
    comp = json.loads(out)["scale_comparison"]
    scaled, unscaled = comp["default"], comp["given"]
    assert scaled["scale"] == pytest.approx(1 / 8) and unscaled["scale"] == 1.0
    assert unscaled["max_weight_mean"] > scaled["max_weight_mean"]
    assert unscaled["entropy_mean"] < scaled["entropy_mean"] < comp["uniform_entropy"]
    for key in ("norm_dS", "norm_dQ", "norm_dK"):      # through the softmax: shrink
        assert unscaled[key] < 1e-6 * scaled[key], key
    assert unscaled["norm_dV"] == pytest.approx(scaled["norm_dV"], rel=1e-3)


def test_unscaled_comparison_printed_side_by_side(capsys):
    code, out, _ = run_main(capsys, "--random", "8,64", "--scale", "1", "--grad")
    assert code == 0
    assert "scale 0.125 (1/sqrt(64))" in out and "scale 1 (--scale)" in out
    row = next(s for s in out.splitlines() if s.strip().startswith("|dS|"))
    scaled, unscaled = (float(x) for x in row.split()[-2:])
    assert unscaled < 1e-6 * scaled
    assert "more saturated" in out and math.isfinite(scaled)

"""fastattn.trace and ``python -m fastattn trace``.

The expected numbers are those of the attention walkthrough (the 3-token
example of numerics/test_walkthrough.py), which rounds to 2 decimals, except
for the causal row of token B, which the text misprints as [0.50, 0.50, 0]: it
is softmax([0, 1/sqrt(2)]) = [0.330, 0.670, 0].
"""

import json
import math
import sys

import numpy as np
import pytest

from fastattn.trace import main, to_json, trace
from support import run_python

X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
S_RAW = np.array([[1.0, 0, 1], [0, 1, 1], [1, 1, 2]])
W_WALKTHROUGH = np.array([[0.40, 0.20, 0.40], [0.20, 0.40, 0.40], [0.25, 0.25, 0.50]])
OUT_WALKTHROUGH = np.array([[0.80, 0.60], [0.60, 0.80], [0.75, 0.75]])
W_CAUSAL = np.array([[1.0, 0.0, 0.0], [0.330, 0.670, 0.0], [0.248, 0.248, 0.503]])
KEYS = ["X", "W_Q", "W_K", "W_V", "Q", "K", "V", "scores", "scale", "scaled", "mask",
        "weights", "output"]


def softmax_rows(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------
# trace()
# ---------------------------------------------------------------------------

def test_default_is_the_walkthrough_example():
    t = trace()
    assert list(t) == KEYS
    np.testing.assert_array_equal(t["X"], X)
    for key in ("W_Q", "W_K", "W_V"):
        np.testing.assert_array_equal(t[key], np.eye(2))
    for key in ("Q", "K", "V"):                       # identity projections: Q = K = V = X
        np.testing.assert_array_equal(t[key], X)
    np.testing.assert_array_equal(t["scores"], S_RAW)
    assert t["scale"] == pytest.approx(1 / math.sqrt(2))
    np.testing.assert_allclose(np.round(t["scaled"], 2),
                               [[0.71, 0, 0.71], [0, 0.71, 0.71], [0.71, 0.71, 1.41]])
    assert t["mask"] is None
    np.testing.assert_allclose(t["weights"], W_WALKTHROUGH, atol=5e-3)
    np.testing.assert_allclose(t["weights"].sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(t["output"], OUT_WALKTHROUGH, atol=5e-3)
    np.testing.assert_allclose(t["weights"], softmax_rows(S_RAW / math.sqrt(2)), rtol=1e-12)
    for key in KEYS:
        if key != "mask":
            assert isinstance(t[key], np.ndarray) or isinstance(t[key], np.floating), key
            assert np.asarray(t[key]).dtype == np.float64, key


def test_causal_mask_and_corrected_row_b():
    t = trace(is_causal=True)
    inf = -np.inf
    np.testing.assert_array_equal(t["mask"], [[0, inf, inf], [0, 0, inf], [0, 0, 0]])
    w = t["weights"]
    np.testing.assert_allclose(w, W_CAUSAL, atol=5e-4)
    # the walkthrough misprints row B as [0.50, 0.50, 0]; it is softmax([0, 0.7071])
    np.testing.assert_allclose(np.round(w[1], 3), [0.330, 0.670, 0.0])
    assert w[1, 0] == pytest.approx(1 / (1 + math.exp(1 / math.sqrt(2))), rel=1e-12)
    assert np.all(w[np.triu_indices(3, 1)] == 0)
    np.testing.assert_allclose(w[2], trace()["weights"][2], rtol=1e-12)   # C unchanged
    np.testing.assert_allclose(t["output"][0], [1.0, 0.0], atol=1e-12)   # A sees only itself
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


def test_weights_and_output_come_from_the_library(monkeypatch):
    import fastattn._api as api

    real = api.attention
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "attention", spy)
    t = trace(is_causal=True, scale=0.5)
    assert len(calls) == 1 and calls[0]["return_weights"] is True
    assert calls[0]["is_causal"] is True and calls[0]["scale"] == 0.5
    np.testing.assert_allclose(t["weights"][1, :2], softmax_rows(np.array([[0, 0.5]]))[0],
                               rtol=1e-12)


def test_drill_change_token_b():
    """'Change token B's embedding from (0, 1) to (1, 1)'."""
    before, after = trace(), trace([[1, 0], [1, 1], [1, 1]])
    np.testing.assert_array_equal(after["scores"], [[1, 1, 1], [1, 2, 2], [1, 2, 2]])
    np.testing.assert_allclose(after["weights"], softmax_rows(after["scores"] / math.sqrt(2)),
                               rtol=1e-12)
    # A now scores B as high as C: its weights become uniform
    np.testing.assert_allclose(after["weights"][0], [1 / 3] * 3, rtol=1e-12)
    # B and C are now the same token, so their rows agree
    np.testing.assert_allclose(after["weights"][1], after["weights"][2], rtol=1e-12)
    assert not np.allclose(before["weights"], after["weights"])


def test_drill_remove_the_mask():
    """'Remove the causal mask and recompute token A's output. Watch it change.'"""
    masked, unmasked = trace(is_causal=True), trace()
    np.testing.assert_allclose(masked["output"][0], [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(unmasked["output"][0], [0.80, 0.60], atol=5e-3)


def test_drill_raw_scores_grow_with_d_k():
    """'Increase d_k to 4 or 8 and watch how much the raw scores grow.'"""
    rng = np.random.default_rng(0)
    spread = {}
    for d in (2, 8, 32):
        t = trace(rng.standard_normal((64, d)))
        spread[d] = t["scores"].std()
        # scaling by 1/sqrt(d_k) keeps the scaled scores at the same spread
        assert 0.5 < t["scaled"].std() < 2.0
    assert spread[2] < spread[8] < spread[32]
    assert spread[32] > 3 * spread[2]


def test_scale_one_saturates_softmax():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 16))
    scaled, unscaled = trace(x), trace(x, scale=1)
    assert unscaled["scale"] == 1.0
    np.testing.assert_array_equal(unscaled["scaled"], unscaled["scores"])
    assert unscaled["weights"].max(axis=1).mean() > scaled["weights"].max(axis=1).mean()
    assert unscaled["weights"].max(axis=1).mean() > 0.9


def test_custom_projections():
    w_q = [[1, 2, 0], [0, 1, 1]]
    w_k = [[0, 1, 1], [1, 0, 2]]
    w_v = [[2, 0], [1, 1]]
    t = trace(X, w_q, w_k, w_v, is_causal=True)
    q, k, v = X @ np.array(w_q), X @ np.array(w_k), X @ np.array(w_v)
    np.testing.assert_allclose(t["scores"], q @ k.T)
    assert t["scale"] == pytest.approx(1 / math.sqrt(3))
    s = q @ k.T / math.sqrt(3) + np.triu(np.full((3, 3), -np.inf), 1)
    np.testing.assert_allclose(t["weights"], softmax_rows(s), rtol=1e-12)
    np.testing.assert_allclose(t["output"], softmax_rows(s) @ v, rtol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=[1, 2, 3]), "x must be a non-empty 2-D"),
    (dict(x=[[1, np.nan]]), "finite"),
    (dict(w_q=np.eye(3)), r"w_q has shape \(3, 3\)"),
    (dict(w_q=np.ones((2, 3))), r"w_q \(2, 3\) and w_k \(2, 2\)"),
    (dict(scale=float("inf")), "scale"),
])
def test_trace_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        trace(**kwargs)


def test_to_json_uses_strings_for_infinities():
    data = json.loads(to_json(trace(is_causal=True)))
    assert data["mask"] == [[0.0, "-inf", "-inf"], [0.0, 0.0, "-inf"], [0.0, 0.0, 0.0]]
    assert json.loads(to_json(trace()))["mask"] is None


def test_trace_function_carries_main():
    # fastattn/__init__.py binds the name fastattn.trace to the function
    assert trace.main is main


# ---------------------------------------------------------------------------
# main(argv)
# ---------------------------------------------------------------------------

def run_main(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_main_prints_the_steps_in_order(capsys):
    code, out, err = run_main(capsys)
    assert code == 0 and err == ""
    steps = ["X (input tokens", "W_Q", "W_K", "W_V", "Q = X W_Q", "K = X W_K", "V = X W_V",
             "scores S_raw = Q K^T", "scale = 1/sqrt(d_k)", "scaled scores", "mask",
             "softmax weights", "output"]
    positions = [out.index(s) for s in steps]
    assert positions == sorted(positions)
    assert "shape (3, 2)" in out and "shape (3, 3)" in out
    assert "1/sqrt(2) = 0.7071" in out
    assert "mask: none" in out
    assert out.count("sum = 1.00") == 3
    for row in ("0.40 0.20 0.40", "0.20 0.40 0.40", "0.25 0.25 0.50",   # weights
                "0.71 0.00 0.71", "0.71 0.71 1.41",                      # scaled scores
                "0.80 0.60", "0.60 0.80", "0.75 0.75"):                  # output
        assert row in out, row


def test_main_causal(capsys):
    code, out, _ = run_main(capsys, "--causal")
    assert code == 0
    assert "0.00 -inf -inf" in out and "0.00 0.00 -inf" in out
    assert "0.33 0.67 0.00   | sum = 1.00" in out
    assert "1.00 0.00" in out


def test_main_drill_token_b(capsys):
    code, out, _ = run_main(capsys, "--x", "1,0; 1,1; 1,1", "--causal")
    assert code == 0
    assert "1.00 2.00 2.00" in out                       # B's raw scores


def test_main_random_and_scale(capsys):
    code, out, _ = run_main(capsys, "--random", "5,8", "--seed", "3", "--scale", "1")
    assert code == 0
    assert "5 tokens, d_model = 8, d_k = 8" in out
    assert "no scaling" in out and "0.3536" in out       # 1/sqrt(8) for comparison
    code2, out2, _ = run_main(capsys, "--random", "5,8", "--seed", "3", "--scale", "1")
    assert out2 == out                                   # seeded
    code3, out3, _ = run_main(capsys, "--random", "5,8", "--seed", "4")
    assert out3 != out
    code, out, _ = run_main(capsys, "--random", "3,4", "--wv", "1,0;0,1;1,1;0,0")
    assert code == 0 and "V = X W_V  shape (3, 2)" in out


def test_main_json(capsys):
    code, out, err = run_main(capsys, "--json", "--causal")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert list(data) == KEYS
    assert data["scale"] == pytest.approx(1 / math.sqrt(2))
    assert data["mask"][0] == [0.0, "-inf", "-inf"]
    np.testing.assert_allclose(data["weights"], W_CAUSAL, atol=5e-4)
    np.testing.assert_allclose(data["X"], X)
    code, out, _ = run_main(capsys, "--json")
    assert json.loads(out)["mask"] is None
    assert "Infinity" not in out and "NaN" not in out


@pytest.mark.parametrize("argv, option", [
    (["--x", "1,0;0"], "--x"),
    (["--x", "1,a;0,1"], "--x"),
    (["--x", ""], "--x"),
    (["--x", "1,0;;0,1"], "--x"),
    (["--x", "1,inf"], "--x"),
    (["--wq", "1,0"], "--wq"),                 # 1 row, d_model is 2
    (["--wk", "1,0,0;0,1,0"], "--wk"),         # d_k 3 vs the identity W_Q's 2
    (["--wq", "1;0", "--wk", "1,0;0,1"], "--wq/--wk"),
    (["--wv", "x"], "--wv"),
    (["--scale", "abc"], "--scale"),
    (["--scale", "nan"], "--scale"),
    (["--random", "3"], "--random"),
    (["--random", "0,2"], "--random"),
    (["--random", "3,2", "--x", "1,0"], "--random"),
    (["--random", "3,2", "--seed", "x"], "--seed"),
    (["--random", "3,2", "--seed", "-1"], "--seed"),
    (["--scale", "1e308"], "--scale"),                 # the scaled scores overflow
    (["--scale", "1e308", "--grad"], "--scale"),
    (["--x", "1e308,1e308;1,1"], "--x"),               # the scores themselves
    (["--random", "100000000000,100"], "--random"),     # tokens beyond memory
    (["--grad-out", "1e308,1e308;1e308,1e308;1e308,1e308"], "--grad-out"),  # dK overflows
    (["--random", "10000000,1"], "error: the trace's matrices do not fit"),  # N x N scores
    (["--random", "1,100000000"], "error: the trace's matrices do not fit"),  # D x D projections
])
def test_main_malformed_arguments(capsys, argv, option):
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert option in lines[0] and lines[0].startswith("python -m fastattn trace: error:")


def test_main_help_and_unknown_option(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0 and "--random N,D" in out and "--plot" in out
    code, _, err = run_main(capsys, "--bogus")
    assert code == 2 and "--bogus" in err


def test_main_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "weights.png"
    code, out, _ = run_main(capsys, "--causal", "--plot", str(path))
    assert code == 0 and str(path) in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # with --json, stdout stays pure JSON
    path2 = tmp_path / "w2.png"
    code, out, _ = run_main(capsys, "--json", "--plot", str(path2))
    assert code == 0 and json.loads(out)["mask"] is None and path2.exists()


def test_main_plot_without_matplotlib(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import fails
    code, out, err = run_main(capsys, "--plot", str(tmp_path / "w.png"))
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "matplotlib" in err
    assert not (tmp_path / "w.png").exists()


def test_main_plot_unwritable(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = run_main(capsys, "--json", "--plot", str(tmp_path / "no" / "dir" / "w.png"))
    assert code == 1 and "--plot" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# python -m fastattn trace
# ---------------------------------------------------------------------------

def cli(*argv):
    return run_python(module="fastattn", argv=["trace", *argv], check=False)


def test_cli_default_and_causal():
    r = cli("--causal")
    assert r.returncode == 0, r.stderr
    assert "0.33 0.67 0.00   | sum = 1.00" in r.stdout
    assert "1/sqrt(2) = 0.7071" in r.stdout


def test_cli_json():
    r = cli("--json", "--x", "1,0;1,1;1,1")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    np.testing.assert_array_equal(data["scores"], [[1, 1, 1], [1, 2, 2], [1, 2, 2]])


def test_cli_malformed_matrix():
    r = cli("--x", "1,0;0")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--x" in lines[0]


def test_cli_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "weights.png"
    r = cli("--plot", str(path))
    assert r.returncode == 0, r.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------
# the variants: soft-capping, ALiBi, windows and sinks
# ---------------------------------------------------------------------------

from fastattn import reference  # noqa: E402


def reference_trace(t, is_causal=False, window=None, alibi=None, softcap=None, sink=None):
    """fastattn.reference.attention on the trace's Q, K, V with the same options
    (one head, so that slopes and sinks have their head axis)."""
    q, k, v = (t[key][None] for key in ("Q", "K", "V"))
    out, w = reference.attention(q, k, v, is_causal=is_causal, scale=float(t["scale"]),
                                 window=window, softcap=softcap,
                                 alibi_slopes=None if alibi is None else [alibi],
                                 sinks=None if sink is None else [sink], return_weights=True)
    return out[0], w[0]


VARIANTS = [
    dict(softcap=0.5),
    dict(alibi=0.5),
    dict(alibi=-0.25, is_causal=True),
    dict(window=1),
    dict(window=(1, 0)),
    dict(window=(None, 0)),
    dict(window=(0, None), is_causal=True),
    dict(sink=0.0),
    dict(sink=-np.inf),
    dict(sink=2.0, is_causal=True),
    dict(window=(1, 0), alibi=0.5, softcap=2.0, sink=0.0, is_causal=True),
]


@pytest.mark.parametrize("kwargs", VARIANTS, ids=str)
@pytest.mark.parametrize("x", ["walkthrough", "random"])
def test_variants_match_the_reference(kwargs, x):
    x = None if x == "walkthrough" else np.random.default_rng(2).standard_normal((7, 4))
    t = trace(x, **kwargs)
    out, w = reference_trace(t, **kwargs)
    np.testing.assert_allclose(t["weights"], w, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t["output"], out, rtol=1e-12, atol=1e-15)


def test_variant_keys_appear_in_step_order():
    t = trace(window=(1, 0), alibi=0.5, softcap=2.0, sink=0.0)
    assert list(t) == ["X", "W_Q", "W_K", "W_V", "Q", "K", "V", "scores", "scale", "scaled",
                       "softcap", "capped", "alibi_slope", "alibi_bias", "biased", "window",
                       "mask", "sink", "sink_weight", "weights", "output"]
    assert list(trace(sink=1.0)) == KEYS[:-2] + ["sink", "sink_weight", "weights", "output"]
    assert list(trace(softcap=1.0))[10:12] == ["softcap", "capped"]


def test_softcap_step():
    t = trace(softcap=0.5)
    assert t["softcap"] == 0.5
    np.testing.assert_allclose(t["capped"], 0.5 * np.tanh(t["scaled"] / 0.5), rtol=1e-15)
    assert np.abs(t["capped"]).max() < 0.5
    np.testing.assert_allclose(t["weights"], softmax_rows(t["capped"]), rtol=1e-12)
    assert t["mask"] is None


def test_alibi_steps():
    t = trace(alibi=0.5, softcap=1.0)
    assert t["alibi_slope"] == 0.5
    np.testing.assert_array_equal(t["alibi_bias"], [[0, -0.5, -1], [-0.5, 0, -0.5],
                                                    [-1, -0.5, 0]])
    assert not np.signbit(np.diag(t["alibi_bias"])).any()     # 0, not -0 ("-0.00")
    np.testing.assert_allclose(t["biased"], t["capped"] + t["alibi_bias"], rtol=1e-15)
    np.testing.assert_allclose(t["weights"], softmax_rows(t["biased"]), rtol=1e-12)


def test_window_step_is_in_the_mask():
    inf = -np.inf
    t = trace(window=(1, 0))
    np.testing.assert_array_equal(t["window"], [1.0, 0.0])
    np.testing.assert_array_equal(t["mask"], [[0, inf, inf], [0, 0, inf], [inf, 0, 0]])
    np.testing.assert_array_equal(trace(window=(None, 0))["mask"], trace(is_causal=True)["mask"])
    np.testing.assert_array_equal(trace(window=(None, 0))["window"], [np.inf, 0.0])
    wide = trace(window=5)
    np.testing.assert_array_equal(wide["mask"], np.zeros((3, 3)))    # nothing hidden
    np.testing.assert_allclose(wide["weights"], trace()["weights"], rtol=1e-12)
    assert np.all(t["weights"][2, :1] == 0)


def test_sink_takes_its_share():
    t = trace(sink=0.0)
    assert t["sink"] == 0.0
    s = t["scaled"]
    expected = np.exp(0.0) / (np.exp(s).sum(axis=1) + np.exp(0.0))
    np.testing.assert_allclose(t["sink_weight"], expected, rtol=1e-12)
    np.testing.assert_allclose(t["weights"].sum(axis=1) + t["sink_weight"], 1.0, rtol=1e-12)
    assert np.all(t["weights"].sum(axis=1) < 1)
    none = trace(sink=-np.inf)                       # a sink of -inf is no sink
    np.testing.assert_array_equal(none["sink_weight"], 0.0)
    np.testing.assert_allclose(none["weights"], trace()["weights"], rtol=1e-12)


def test_variants_do_not_call_the_library(monkeypatch):
    import fastattn._api as api

    def fail(*args, **kwargs):
        raise AssertionError("trace computes the variants in its own NumPy")

    monkeypatch.setattr(api, "attention", fail)
    trace(alibi=0.5)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(window=-1), ValueError, "window"),
    (dict(window=(1, 2, 3)), ValueError, "window"),
    (dict(window=True), TypeError, "window"),
    (dict(window=1.5), TypeError, "window"),
    (dict(softcap=0.0), ValueError, "softcap"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=np.inf), ValueError, "softcap"),
    (dict(softcap="1"), TypeError, "softcap"),
    (dict(alibi=np.nan), ValueError, "alibi"),
    (dict(alibi=np.inf), ValueError, "alibi"),
    (dict(alibi=True), TypeError, "alibi"),
    (dict(sink=np.nan), ValueError, "sink"),
    (dict(sink=np.inf), ValueError, "sink"),
    (dict(sink="0"), TypeError, "sink"),
])
def test_variant_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        trace(**kwargs)


def test_main_variants_text(capsys):
    code, out, err = run_main(capsys, "--causal", "--window", "1,0", "--alibi", "0.5",
                              "--softcap", "2", "--sink", "0")
    assert code == 0 and err == ""
    assert "causal, softcap 2, ALiBi slope 0.5, window (1, 0), sink 0" in out
    steps = ["scaled scores", "soft-capped scores S_cap = c * tanh(S_scaled / c)",
             "ALiBi bias B = -m * |i - j|", "biased scores S_bias = S_cap + B",
             "mask M (causal", "window (1, 0): token i sees the keys j with i - 1 <= j <= i + 0",
             "the sink: logit t = 0", "the sink's share of each row: A 0.34",
             "softmax weights = softmax(S_bias + M) with the sink", "output = weights V"]
    positions = [out.index(s) for s in steps]
    assert positions == sorted(positions)
    assert "0.00 -0.50 -1.00" in out                 # the bias of row A
    assert "| sum = 0.66" in out and "sum = 1.00" not in out


def test_main_window_forms(capsys):
    for argv, shown in ((["--window", "1"], "window (1, 1)"),
                        (["--window", "none,0"], "window (None, 0)"),
                        (["--window", "2,None"], "window (2, None)")):
        code, out, _ = run_main(capsys, *argv)
        assert code == 0 and shown in out, (argv, out[:200])


def test_main_variants_json(capsys):
    code, out, err = run_main(capsys, "--json", "--window", "0,none", "--alibi", "0.25",
                              "--sink=-inf", "--softcap", "1")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert list(data)[10:19] == ["softcap", "capped", "alibi_slope", "alibi_bias", "biased",
                                 "window", "mask", "sink", "sink_weight"]
    assert data["window"] == [0.0, "inf"] and data["sink"] == "-inf"
    assert data["mask"][1] == ["-inf", 0.0, 0.0]
    t = trace(window=(0, None), alibi=0.25, sink=-np.inf, softcap=1.0)
    np.testing.assert_allclose(data["weights"], t["weights"], rtol=1e-15)
    np.testing.assert_allclose(data["alibi_bias"], t["alibi_bias"])


@pytest.mark.parametrize("argv, option", [
    (["--window", "x"], "--window"),
    (["--window", "-1"], "--window"),
    (["--window", "1,2,3"], "--window"),
    (["--window", "1.5"], "--window"),
    (["--alibi", "abc"], "--alibi"),
    (["--alibi", "inf"], "--alibi"),
    (["--softcap", "0"], "--softcap"),
    (["--softcap", "-2"], "--softcap"),
    (["--softcap", "nan"], "--softcap"),
    (["--sink", "nan"], "--sink"),
    (["--sink", "inf"], "--sink"),
    (["--sink", "x"], "--sink"),
    (["--alibi", "1e308"], "--alibi"),                 # the biased scores overflow
    (["--softcap", "1e-320", "--grad"], "--softcap"),  # its reciprocal overflows
])
def test_main_malformed_variant_arguments(capsys, argv, option):
    test_main_malformed_arguments(capsys, argv, option)     # status 2, one line on stderr


def test_main_help_lists_the_variants(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    for flag in ("--window", "--alibi SLOPE", "--softcap CAP", "--sink LOGIT"):
        assert flag in out


def test_main_plot_variants(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "variants.png"
    code, out, _ = run_main(capsys, "--causal", "--window", "1,0", "--alibi", "0.5",
                            "--softcap", "2", "--sink", "0", "--plot", str(path))
    assert code == 0 and str(path) in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_shows_the_variants(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes
    from fastattn._trace_show import save_plot

    titles, images = [], []
    real_title, real_imshow = matplotlib.axes.Axes.set_title, matplotlib.axes.Axes.imshow
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title",
                        lambda self, s, *a, **k: (titles.append(s), real_title(self, s, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow",
                        lambda self, a, *r, **k: (images.append(np.asarray(a)),
                                                  real_imshow(self, a, *r, **k))[1])
    t = trace(window=(1, 0), alibi=0.5, sink=0.0)
    save_plot(t, str(tmp_path / "p.png"), ["A", "B", "C"], causal=False)
    assert titles[0] == "scores after ALiBi, masked"
    assert titles[1] == "attention weights\n(window (1, 0), sink 0)"
    assert images[1].shape == (3, 4)                         # the sink's column
    np.testing.assert_allclose(images[1][:, 3], t["sink_weight"])


def test_cli_variants():
    r = cli("--window", "1,0", "--sink", "0", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "sink_weight" in data and data["window"] == [1.0, 0.0]
    r = cli("--softcap", "0")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "--softcap" in r.stderr


def test_main_window_longer_than_any_index_is_the_unbounded_window(capsys):
    code, out, _ = run_main(capsys, "--window", "99999999999999999999999", "--json")
    assert code == 0
    wide = json.loads(out)
    code, out, _ = run_main(capsys, "--json")
    assert code == 0
    np.testing.assert_allclose(wide["weights"], json.loads(out)["weights"], rtol=1e-15)

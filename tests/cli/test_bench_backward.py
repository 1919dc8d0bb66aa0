"""The benchmark's ``backward`` section on tiny shapes: the structure of its
JSON rows, each with its figures and no error record, and its tables.

Nothing here asserts anything about speed.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import fastattn
import fastattn._core as fa_core
from fastattn.bench import backward_options, backward_section, cli
from fastattn.bench.backward_report import format_backward
from fastattn.bench.backward_section import run_backward_section
from fastattn.bench.cases import QUICK
from fastattn.bench.peers import discover_tools
from fastattn.bench.progress import Progress
from fastattn.bench.runner import Bench
from fastattn.bench.timing import ratio_stats

TINY = dataclasses.replace(QUICK, budget_s=0.005, min_sample_s=0.001, max_repeats=3,
                           backward=(((1, 1, 32, 32, 16), False), ((1, 2, 48, 48, 8), True)),
                           backward_options=(1, 1, 64, 64, 16),
                           backward_bias=(((2, 1, 32, 32, 16), (1, 1, 32, 32)),))
RATIO_KEYS = {"median", "q1", "q3", "rounds"}


def _bench(peers, profile=TINY):
    tools = discover_tools(peers)
    peers = tuple(p for p in peers if getattr(tools, p) is not None)
    return Bench(fastattn, fa_core, tools, profile, [1, 2], peers, 3, 2 ** 30,
                 Progress(1, enabled=False))


def _has_torch():
    return discover_tools(("torch",)).torch is not None


def _no_error(node, path="$"):
    """Every "error" record anywhere in ``node`` (as .ci/run looks for them)."""
    if isinstance(node, dict):
        assert "error" not in node, f"{path}: {node['error']}"
        for k, v in node.items():
            _no_error(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _no_error(v, f"{path}[{i}]")


@pytest.fixture(scope="module")
def section():
    """The section on the tiny profile, with torch when it is installed (no
    pause between samples: these calls take microseconds)."""
    b = _bench(("torch",))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backward_section, "SETTLE_S", 0.0)
        return run_backward_section(b, quick=True, eager_max_bytes=2 ** 30), b


def _check_ratio(stats):
    assert set(stats) == RATIO_KEYS and stats["rounds"] >= 3
    assert 0 < stats["q1"] <= stats["median"] <= stats["q3"]


def test_rows_carry_their_figures(section):
    sec, b = section
    json.dumps(sec)                               # the JSON document takes it as it is
    _no_error(sec)
    rows = sec["rows"]
    assert [(r["shape"]["L"], r["dtype"], r["threads"]) for r in rows] == [
        (L, dt, t) for L in (32, 48) for dt in ("float32", "bfloat16") for t in (1, 2)]
    torch_there = "torch" in b.peers
    for r in rows:
        assert r["section"] == "backward" and r["kind"] == "fwd_bwd"
        assert r["fastattn_fwd_bwd_s"] > 0 and r["gflops_fwd_bwd"] > 0
        assert r["path"] == fastattn.get_isa()
        assert r["flops_bwd"] == 2.5 * r["flops_fwd"]          # the FLOP ratio
        for name in ("fastattn_fwd_bwd", "fastattn_fwd", "fastattn_bwd"):
            assert len(r["impls"][name]["times_s"]) == 3 and r["impls"][name]["median_s"] > 0
        _check_ratio(r["bwd_over_fwd"])
        assert r["bwd_over_fwd_target"] == (2.5 if r["dtype"] == "float32" else None)
        if torch_there:
            _check_ratio(r["vs_torch"])
            assert r["torch_fwd_bwd_s"] > 0 and r["grad_ok"], r
            assert r["torch_kernel"]
        else:
            assert r["vs_torch"] is None and "torch_fwd_bwd" not in r["impls"]
    f32 = [r for r in rows if r["dtype"] == "float32"]
    assert all(r["vs_torch_target"] == 1.4 for r in f32)


def test_bfloat16_target_only_with_bf16_instructions(section):
    sec, b = section
    bf16_machine = any(i in fastattn.available_isas() for i in ("avx512_bf16", "amx"))
    for r in sec["rows"]:
        if r["dtype"] == "bfloat16":
            assert r["vs_torch_target"] == (3.0 if bf16_machine else None)
            assert any("no target" in n for n in r["notes"]) == (not bf16_machine)


def test_thread_scaling_records(section):
    sec, _ = section
    assert [(s["case"], s["dtype"], s["threads"]) for s in sec["scaling"]] == [
        (case, dt, 2) for case in ("1x1x32x16", "1x2x48x8") for dt in ("float32", "bfloat16")]
    for s in sec["scaling"]:
        assert s["target"] == 1.8
        for name in ("fastattn_fwd_bwd", "fastattn_fwd", "fastattn_bwd"):
            _check_ratio(s[name])


def test_learned_bias_rows_time_its_gradient(section):
    sec, b = section
    rows = sec["bias"]
    assert [(r["case"], r["dtype"], r["threads"]) for r in rows] == [
        ("2x1x32x16", dt, t) for dt in ("float32", "bfloat16") for t in (1, 2)]
    for r in rows:
        assert r["kind"] == "learned_bias" and r["bias_shape"] == [1, 1, 32, 32]
        for name in ("fastattn_fwd_bwd", "fastattn_fwd_bwd_no_bias_grad"):
            assert len(r["impls"][name]["times_s"]) == 3 and r["impls"][name]["median_s"] > 0
        _check_ratio(r["bias_grad_cost"])
        if "torch" in b.peers:
            _check_ratio(r["vs_torch"])
            assert r["grad_ok"] and r["torch_kernel"], r
        else:
            assert r["vs_torch"] is None and "grad_rel_diff" not in r


def test_learned_bias_grad_check_sees_a_wrong_bias_gradient():
    """The check compares all four gradients: a bias gradient off by 1% fails it."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from fastattn.bench import backward_bias, peers
    q, k, v, bias, d_o = backward_bias._inputs((2, 1, 32, 32, 16), (1, 1, 32, 32), "float32")
    run, _ = backward_bias._torch_impl(torch, q, k, v, bias, d_o)
    want = [g.clone() for g in run()]
    got = list(backward_bias._fastattn_impls(fastattn, q, k, v, bias, d_o)
               ["fastattn_fwd_bwd"](1)())
    res = {"fastattn_fwd_bwd@1": {"output": got}, "torch_fwd_bwd@1": {"output": want}}
    assert peers.grads_vs_torch(res, "float32")["grad_ok"]
    got[3] = got[3] * 1.01
    assert not peers.grads_vs_torch(res, "float32")["grad_ok"]


def test_score_options_time_and_memory(section):
    sec, b = section
    opts = sec["options"]
    assert [o["option"] for o in opts] == ["softcap", "window512", "sinks"]
    for o in opts:
        fa = o["fastattn"]
        assert len(fa["times_s"]) == 3 and fa["median_s"] > 0
        assert fa["extra_peak_bytes"] >= 0 and fa["output_bytes"] == 3 * 64 * 16 * 4 + (
            4 if o["option"] == "sinks" else 0)
        assert o["vs_eager_target"] == 5.0 and o["extra_target_bytes"] == 64 * 2 ** 20
        if "torch" in b.peers:
            assert o["eager"]["median_s"] > 0 and o["eager"]["extra_peak_bytes"] >= 0
            _check_ratio(o["vs_eager"])
            assert o["grad_max_abs_diff_small"] < 1e-4
        else:
            assert "torch" in o["eager"]["skipped"] and o["vs_eager"] is None


def test_tables_show_every_row(section):
    sec, _ = section
    text = format_backward(sec)
    assert "## Backward" in text and "thread scaling" in text and "eager formula" in text
    lines = text.splitlines()
    assert sum(line.startswith("| 1x") for line in lines) == len(sec["rows"]) + len(
        sec["scaling"])
    assert sum(line.startswith("| 2x1x32x16 | 1x1x32x32 |") for line in lines) == len(
        sec["bias"]) and "learned bias" in text
    if any(r["torch_kernel"] for r in sec["bias"]):    # torch's path named in words
        assert "math path (ends in " in text or "ScaledDotProduct" in text
    for option in ("softcap", "window512", "sinks"):
        assert any(line.startswith(f"| {option} |") for line in lines)
    assert "≤ 2.5" in text and "≥ 1.8" in text


def test_without_torch_fastattn_rows_remain():
    b = _bench((), dataclasses.replace(TINY, backward=TINY.backward[:1], backward_options=()))
    sec = run_backward_section(b, quick=True, eager_max_bytes=2 ** 30)
    _no_error(sec)
    assert sec["options"] == [] and len(sec["rows"]) == 4 and len(sec["bias"]) == 4
    for r in sec["rows"]:
        assert r["vs_torch"] is None and r["bwd_over_fwd"]["median"] > 0
    for r in sec["bias"]:
        assert r["vs_torch"] is None and r["bias_grad_cost"]["median"] > 0
    assert "| — |" in format_backward(sec)


def test_eager_formula_on_the_heads_that_fit_the_limit(monkeypatch):
    monkeypatch.setattr(backward_options.procmem, "available_bytes", lambda: None)
    shape = (1, 8, 8192, 8192, 64)
    need = backward_options.estimate_eager_bytes("sinks", shape)
    assert need > 8 * 2 ** 30                    # 2 GiB score matrices, several
    heads, why = backward_options.eager_heads("sinks", shape, True, 3 * 2 ** 30)
    assert heads == 2 and why.startswith("run on 2 of the 8 heads, its times and memory x 4")
    assert f"~{need / 2 ** 30:.1f} GiB" in why
    heads, why = backward_options.eager_heads("softcap", shape, True, 2 ** 30)
    assert heads == 0 and why.startswith("not run")
    assert backward_options.eager_heads("softcap", (1, 1, 64, 64, 16), True, 2 ** 30) == (
        1, None)
    heads, why = backward_options.eager_heads("window512", (1, 1, 64, 64, 16), False, 2 ** 30)
    assert heads == 0 and "torch" in why


def test_eager_on_a_subset_of_heads_scaled_to_all(monkeypatch):
    monkeypatch.setattr(backward_options.procmem, "available_bytes", lambda: None)
    shape = (1, 4, 64, 64, 16)
    limit = backward_options.estimate_eager_bytes("sinks", (1, 2, 64, 64, 16))
    progress = Progress(3, enabled=False)
    monkeypatch.setattr(backward_options, "OPTIONS", ("sinks",))
    [row] = backward_options.run_options(shape, 1, 3, torch=_has_torch(), eager_max_bytes=limit,
                                         progress=progress)
    _no_error(row)
    if not _has_torch():
        assert row["vs_eager"] is None
        return
    eg = row["eager"]
    assert eg["heads"] == 2 and eg["scaled_by"] == 2.0 and len(eg["times_s"]) == 3
    assert any("run on 2 of the 4 heads" in n for n in row["notes"])
    _check_ratio(row["vs_eager"])


def test_ratio_stats_median_and_quartiles_of_the_rounds():
    s = ratio_stats([2.0, 4.0, 6.0, 100.0], [1.0, 1.0, 1.0, 1.0])
    assert s == {"median": 5.0, "q1": 3.5, "q3": 29.5, "rounds": 4}
    assert ratio_stats([3.0], [1.5]) == {"median": 2.0, "q1": 2.0, "q3": 2.0, "rounds": 1}
    assert ratio_stats([], [1.0]) is None


def test_list_and_options(capsys):
    assert cli.main(["--list", "--suite", "backward", "--quick"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 * len(QUICK.backward) + 2 * len(QUICK.backward_bias) + 1
    assert out[-2].startswith("backward bias 2x2x128x128x32 bias 1x2x128x128 bfloat16")
    assert out[-1].startswith("backward options 1x2x1024x1024x64")
    with pytest.raises(SystemExit) as exc:
        cli.main(["--eager-max-gib", "0"])
    assert exc.value.code == 2

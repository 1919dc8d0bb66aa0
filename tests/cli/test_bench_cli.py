"""The benchmark command line (``python -m fastattn bench``).

These tests check that the harness runs and reports what it should.  They
never assert anything about speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time

import pytest

from fastattn.bench import cases, cli, peers, report, timing
from support import run_python

TIMEOUT = 120
QUICK_TIMEOUT = 360




def _run(*args, timeout=TIMEOUT):
    return run_python(argv=args, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One ``--quick`` run shared by the tests below (it takes ~1 min alone;
    the limit leaves room for a busy machine)."""
    d = tmp_path_factory.mktemp("bench")
    js, png = d / "quick.json", d / "quick.png"
    args = ["-m", "fastattn", "bench", "--quick", "--json", str(js)]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(png)]
    except ImportError:
        png = None
    p = _run(*args, timeout=QUICK_TIMEOUT)
    _keep(p, js)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p, json.loads(js.read_text()), png


def _keep(p, js):
    """With FASTATTN_TEST_KEEP_QUICK_BENCH=DIR, the run's exit status, output
    and JSON are written to DIR: .ci/run checks them as the README benchmark
    command's run when installing the [bench] extra changes nothing in the
    environment, instead of running the same command a second time."""
    keep = os.environ.get("FASTATTN_TEST_KEEP_QUICK_BENCH")
    if not keep:
        return
    os.makedirs(keep, exist_ok=True)
    with open(os.path.join(keep, "bench.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if js.exists():
        shutil.copyfile(js, os.path.join(keep, "bench.json"))
    with open(os.path.join(keep, "rc"), "w") as f:  # last: the run is complete
        f.write(f"{p.returncode}\n")


def test_quick_json_fields(quick_run):
    _, doc, _ = quick_run
    assert doc["schema"] == "fastattn-bench/1"
    meta = doc["meta"]
    for key in ("date", "cpu_model", "isa", "numpy", "scipy", "torch", "threads",
                "suite", "elapsed_s", "fastattn"):
        assert key in meta, key
    assert meta["threads"] == [1, 2]

    assert doc["peaks"], "no matmul peak measured"
    for pk in doc["peaks"]:
        assert pk["gflops"] > 0 and pk["threads"] in (1, 2)
        assert pk["dtype"] in ("float32", "float64")

    rows = doc["results"]
    assert {r["section"] for r in rows} == {"attention", "decode", "overhead",
                                           "float64", "softmax"}
    assert {r["threads"] for r in rows} == {1, 2}
    assert {r["causal"] for r in rows if r["section"] == "attention"} == {False, True}
    assert any(r["dtype"] == "float64" for r in rows)
    torch_there = meta["torch"] is not None
    for r in rows:
        for key in ("case", "shape", "dtype", "causal", "threads", "fastattn_s",
                    "gflops", "frac_peak", "speedup", "impls", "skipped", "notes"):
            assert key in r, key
        assert r["fastattn_s"] > 0
        fa = r["impls"][r["variant"]]
        assert fa["median_s"] == r["fastattn_s"]
        assert len(fa["times_s"]) >= 3 and fa["loops"] >= 1
        assert "numpy" in r["impls"]
        assert r["speedup"]["numpy"] > 0
        # paired: the median of the per-round ratios
        assert r["speedup"]["numpy"] == timing.paired_ratio(r["impls"]["numpy"]["times_s"],
                                                            fa["times_s"])
        assert r["speedup_of_medians"]["numpy"] > 0
        if torch_there:
            assert r["speedup"]["torch"] > 0
        if r["kind"] == "attention":
            assert r["flops"] > 0 and r["gflops"] > 0 and r["frac_peak"] > 0
            assert set("BHLSD") == set(r["shape"])
            # the harness checks fastattn's output against a peer's
            assert r["output_ok"], r["notes"]
    dec = [r for r in rows if r["section"] == "decode"]
    assert dec and all(r["shape"]["L"] == 1 < r["shape"]["S"] for r in dec)
    grouped = [r for r in dec if r["kv_heads"] < r["shape"]["H"]]  # the grouped-query step
    assert grouped and all(r["output_ok"] for r in grouped)
    assert {r["dtype"] for r in grouped} == {"float32", "float16", "bfloat16"}
    assert any(r["variant"] == "fastattn_inplace" for r in rows)

    assert doc["scaling"] and all(s["threads"] == 2 for s in doc["scaling"])
    # the FMA probe timed in the rounds of every case: the machine's scaling then
    for r in rows:
        assert len(r["impls"]["machine"]["times_s"]) == len(r["impls"][r["variant"]]["times_s"])
    assert all(s["machine"] > 0 for s in doc["scaling"])
    fma = {(f["dtype"], f["threads"]): f for f in doc["fma_peaks"]}
    assert set(fma) == {(d, t) for d in ("float32", "float64") for t in (1, 2)}
    for (d, t), f in fma.items():
        assert f["gflops"] > 0 and len(f["times_s"]) >= 3
        assert ("speedup_vs_1" in f) == (t == 2)
    for r in rows:
        if r["kind"] == "attention":
            adt = "float32" if r["dtype"] in ("float16", "bfloat16") else r["dtype"]
            assert r["frac_fma_peak"] == r["gflops"] / fma[(adt, r["threads"])]["gflops"]
    mem = doc["memory"]
    assert {m["impl"] for m in mem} >= {"fastattn", "numpy"}
    for m in mem:
        assert "error" not in m, m
        assert m["extra_peak_bytes"] >= 0 and m["scores_bytes"] > 0


def test_quick_output(quick_run):
    p, _, _ = quick_run
    assert "| case |" in p.stdout and "GFLOP/s" in p.stdout
    assert "matmul peak" in p.stdout and "ISA in use" in p.stdout
    assert "Peak memory" in p.stdout and "Thread scaling" in p.stdout
    assert "FMA peak float32 2 thread(s)" in p.stdout and "own ceiling" in p.stdout
    assert "machine: FMA probe speed-up, same rounds" in p.stdout
    # progress goes to stderr, one line per measurement when not a terminal
    assert "[1/" in p.stderr
    assert "| case |" not in p.stderr


def test_quick_runs_the_backward_section(quick_run):
    p, doc, _ = quick_run
    sec = doc["backward"]
    assert {r["dtype"] for r in sec["rows"]} == {"float32", "bfloat16"}
    assert {r["threads"] for r in sec["rows"]} == {1, 2}
    assert all(r["fastattn_fwd_bwd_s"] > 0 and r["bwd_over_fwd"]["median"] > 0
               for r in sec["rows"])
    assert sec["scaling"] and [o["option"] for o in sec["options"]] == [
        "softcap", "window512", "sinks"]
    assert [(r["dtype"], r["threads"]) for r in sec["bias"]] == [
        (dt, t) for dt in ("float32", "bfloat16") for t in (1, 2)]
    assert "## Backward" in p.stdout and "learned bias" in p.stdout
    assert p.stdout.index("## Backward") < p.stdout.index("total benchmark time")


def test_plot_writes_png(quick_run):
    _, _, png = quick_run
    if png is None:
        pytest.skip("matplotlib is not installed")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_custom_shapes(tmp_path):
    js = tmp_path / "c.json"
    p = _run("-m", "fastattn", "bench", "--shapes", "1,2,8,4;1,2,1,16,8", "--threads", "1",
             "--causal", "yes", "--repeats", "3", "--peers", "numpy",
             "--json", str(js), timeout=60)
    assert p.returncode == 0, p.stderr
    rows = json.loads(js.read_text())["results"]
    assert [(r["shape"]["L"], r["shape"]["S"], r["causal"]) for r in rows] == \
        [(8, 8, True), (1, 16, True)]
    assert all("torch" not in r["impls"] for r in rows)
    assert all(len(r["impls"]["fastattn"]["times_s"]) == 3 for r in rows)


@pytest.mark.parametrize("bad", [
    ["--threads", "0"],
    ["--threads", "two"],
    ["--threads", "99999999999999999999999"],   # beyond any C integer
    ["--threads", "1,257"],
    ["--dtype", "float16"],
    ["--causal", "maybe"],
    ["--shapes", "1,2,3"],
    ["--shapes", "1,2,0,4"],
    ["--repeats", "0"],
    ["--peers", "jax"],
    ["--suite", "nonsense"],
    ["--eager-max-gib", "0"],
    ["--no-such-option"],
    ["--isa", "no-such-isa", "--shapes", "1,1,4,4"],
    ["--shapes", "1,1,99999999999,64"],
    ["--json", "/no/such/folder/run.json"],
    ["--json", "."],
    ["--plot", "/no/such/folder/run.png"],
])
def test_bad_options_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(bad)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_bad_option_process_exit_code():
    p = _run("-m", "fastattn", "bench", "--causal", "sometimes", timeout=60)
    assert p.returncode == 2
    assert "usage" in p.stderr
    p = _run("-m", "fastattn", "frobnicate", timeout=60)
    assert p.returncode == 2


def test_help():
    for args in (["-m", "fastattn", "--help"], ["-m", "fastattn", "bench", "--help"]):
        p = _run(*args, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "usage" in p.stdout
    p = _run("-m", "fastattn", "bench", "--help", timeout=60)
    assert "--shapes" in p.stdout and "--quick" in p.stdout


def test_plot_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # makes the import fail
    with pytest.raises(SystemExit) as exc:
        cli.main(["--quick", "--plot", str(tmp_path / "x.png")])
    assert exc.value.code == 2
    assert "matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_list_only(capsys):
    assert cli.main(["--list", "--shapes", "1,8,1024,64", "--threads", "1,2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4          # 2 causal variants x 2 thread counts


def test_shape_parsing_and_flops():
    assert cases.parse_shapes("1,8,1024,64; 1,32,1,4096,128") == [
        (1, 8, 1024, 1024, 64), (1, 32, 1, 4096, 128)]
    assert cases.causal_fraction(1024, 1024, True) == 0.5
    assert cases.causal_fraction(1, 4096, True) == 1 / 4096
    assert cases.causal_fraction(7, 9, False) == 1.0
    case = cases.Case("attention", "attention", (1, 8, 1024, 1024, 64), "float32", True)
    assert case.flops() == 2 * 8 * 1024 * 1024 * 64
    assert cases.parse_int_list("1,2,2", "--threads") == [1, 2]


def test_openblas_env_untouched(monkeypatch):
    """The harness must leave OPENBLAS_* alone (see bench/README.md)."""
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    cli.main(["--list"])
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"


def test_interleaved_samples_run_under_their_context_and_are_rewarmed(monkeypatch):
    """One run mixes thread counts: each implementation's warm-up, untimed
    re-warm and samples run inside its own context (its thread limit); the
    settle pause comes only after another implementation's sample that may
    leave spinning workers."""
    monkeypatch.setattr(timing, "REWARM_S", 0.0)         # re-warm: one call
    active, log = [], []
    monkeypatch.setattr(timing.time, "sleep", lambda s: log.append(("pause", None)))

    class Limit:
        def __init__(self, t):
            self.t = t

        def __enter__(self):
            active.append(self.t)

        def __exit__(self, *exc):
            active.pop()

    def impl(t):
        def call():
            t_end = time.perf_counter() + 0.0015   # > 1 ms: warm-up is 1 + 1 timed call
            while time.perf_counter() < t_end:
                pass
            log.append((t, list(active)))
            return t
        return call

    timed_loop = timing._time_loop

    def marked_loop(fn, loops):
        log.append(("timed", None))
        return timed_loop(fn, loops)

    monkeypatch.setattr(timing, "_time_loop", marked_loop)
    prof = dataclasses.replace(cases.QUICK, min_sample_s=0.0)   # 1 call a sample
    res = timing.run_interleaved({"a@1": impl(1), "a@2": impl(2)}, prof, repeats=3,
                                 settle_s=1e-4, context=lambda n: Limit(int(n[-1])),
                                 spinning={"a@2"})
    calls = [e for e in log if e[0] in (1, 2)]
    assert all(ctx == [t] for t, ctx in calls), calls
    seq = [e[0] for e in log]
    assert seq[:6] == [1, "timed", 1, 2, "timed", 2]      # warm-up
    # 3 rounds x 2 samples (order rotates), each an untimed call then the timed
    # one; a pause only where a@1 follows a@2
    assert seq[6:] == ["pause", 1, "timed", 1, 2, "timed", 2,
                       2, "timed", 2, "pause", 1, "timed", 1,
                       1, "timed", 1, 2, "timed", 2]
    assert [len(r["times_s"]) for r in res.values()] == [3, 3]
    assert res["a@2"]["output"] == 2


@pytest.mark.parametrize("noisy", [False, True])
def test_adaptive_rounds_extend_only_while_samples_spread(monkeypatch, noisy):
    # scripted sample times (ms): "b" steady; "a" steady, or disturbed in its
    # 2nd and 3rd rounds (an interquartile range far above NOISY_SPREAD)
    script = {"a": [1.0, 1.6, 1.7, 1.0, 1.01, 0.99, 1.0, 1.0] if noisy else [1.0] * 8,
              "b": [2.0] * 8}
    taken = {"a": 0, "b": 0}
    rounds = []                                   # set while the timed rounds run

    def scripted_loop(fn, loops):
        name = fn()
        if not rounds:                            # warm-up and calibration
            return 1e-3
        taken[name] += 1
        return script[name][taken[name] - 1] * 1e-3

    @contextlib.contextmanager
    def timed_rounds():
        rounds.append(True)
        try:
            yield
        finally:
            rounds.clear()

    monkeypatch.setattr(timing, "_time_loop", scripted_loop)
    monkeypatch.setattr(timing, "_no_gc", timed_rounds)
    prof = dataclasses.replace(cases.QUICK, min_sample_s=0.0, budget_s=0.0,
                               min_repeats=3, max_repeats=6)
    impls = {"a": lambda: "a", "b": lambda: "b"}
    res = timing.run_interleaved(impls, prof, None)
    n = len(res["a"]["times_s"])
    assert len(res["b"]["times_s"]) == n          # every round times both
    if noisy:
        # rounds 4, 5, ... added until a's spread falls below NOISY_SPREAD or
        # max_repeats is reached; the median rests on the undisturbed rounds
        assert 3 < n <= 6
        assert res["a"]["median_s"] == pytest.approx(1.0e-3, rel=0.02)
    else:
        assert n == 3
    # an explicit repeat count is never extended
    taken.update(a=0, b=0)
    res = timing.run_interleaved(impls, prof, 3)
    assert [len(r["times_s"]) for r in res.values()] == [3, 3]


def test_scaling_is_the_median_of_paired_ratios():
    # round 2 was a slow spell for both thread counts: the paired ratios stay 2
    assert timing.paired_ratio([2.0, 2.0, 9.0], [1.0, 1.0, 4.5]) == 2.0
    assert timing.paired_ratio([3.0, 1.0], [1.0]) == 3.0   # capped peer: first rounds
    rows = []
    for t, times in ((1, [2.0, 4.0, 2.2]), (2, [1.0, 2.0, 1.1])):
        rows.append({"case": "c", "dtype": "float32", "causal": False, "threads": t,
                     "variant": "fastattn", "fastattn_s": sorted(times)[1],
                     "impls": {"fastattn": {"times_s": times},
                               "torch": {"times_s": [x * 1.5 for x in times]}}})
    rows[1]["impls"]["torch"]["times_s"][0] *= 2          # one slow 2-thread sample
    (rec,) = report.scaling_rows(rows)
    assert rec["threads"] == 2 and rec["fastattn"] == 2.0 and rec["torch"] == 2.0
    assert "machine" not in rec


def test_machine_scaling_counts_the_probe_work_of_every_thread():
    # the FMA probe runs n steps on each thread: at 2 threads twice the work,
    # so equal times are a speed-up of 2, and a 2-thread round as slow as two
    # 1-thread ones (two threads sharing one core) is a speed-up of 1
    rows = []
    for t, times in ((1, [1.0, 1.0, 1.0]), (2, [1.0, 2.0, 1.0])):
        rows.append({"case": "c", "dtype": "float32", "causal": False, "threads": t,
                     "variant": "fastattn", "fastattn_s": 1.0,
                     "impls": {"fastattn": {"times_s": [1.0 / t] * 3},
                               "machine": {"times_s": times}}})
    (rec,) = report.scaling_rows(rows)
    assert rec["machine"] == 2.0
    rows[1]["impls"]["machine"]["times_s"] = [2.0, 2.0, 1.0]
    assert report.scaling_rows(rows)[0]["machine"] == 1.0
    text = report.format_scaling(report.scaling_rows(rows), ["torch"])
    assert "machine: FMA probe speed-up, same rounds" in text
    assert text.splitlines()[-1].endswith("| 2.00× | — | 1.00× |")



# A small run: one tiny attention shape and the (quick) memory section.
SMALL_RUN = ["--quick", "--suite", "attention,memory", "--shapes", "1,2,8,4",
             "--threads", "1", "--repeats", "3", "--causal", "no", "--no-progress"]


def test_discovery_reports_a_missing_peer(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)        # makes the import fail
    tools = peers.discover_tools(("torch", "numpy"))
    assert tools.torch is None and tools.scipy is not None
    assert tools.missing["torch"] == ("peer", "not installed", "its columns are left out")
    assert peers.available_peers(("torch", "numpy"), tools) == ("numpy",)


def test_run_without_torch_notes_it_and_has_no_error_records(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)        # torch absent, installed or not
    js = tmp_path / "notorch.json"
    assert cli.main(SMALL_RUN + ["--json", str(js)]) == 0
    out, err = capsys.readouterr()
    assert "- peer: torch not installed: its columns are left out" in out
    assert "vs torch" not in out and "Traceback" not in out + err
    doc = json.loads(js.read_text())
    assert doc["meta"]["torch"] is None and "torch" in doc["meta"]["unavailable"]
    assert doc["meta"]["peers"] == ["numpy"]
    for r in doc["results"]:
        assert "torch" not in r["impls"] and "torch" not in r["skipped"]
    assert {m["impl"] for m in doc["memory"]} == {"fastattn", "numpy"}
    for m in doc["memory"]:
        assert "error" not in m, m


def test_run_with_torch_times_it(tmp_path):
    pytest.importorskip("torch")
    js = tmp_path / "torch.json"
    assert cli.main(SMALL_RUN + ["--peers", "torch", "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert "torch" not in doc["meta"]["unavailable"]
    assert all(r["speedup"]["torch"] > 0 for r in doc["results"])
    assert {m["impl"] for m in doc["memory"]} == {"fastattn", "torch"}
    assert all("error" not in m for m in doc["memory"])


def test_varlen_case_packed_and_padded_calls_agree():
    """The variants section's packed batch: lengths spread over L/32 .. L,
    attention_varlen and the padded call with a key_padding_mask give the
    same rows, and the flops count the sequences' own causal work."""
    import numpy as np

    import fastattn

    B, H, L, D = 5, 2, 64, 8
    case = cases.Case("variants", "attention", (B, H, L, L, D), "float32", True, "varlen")
    n = cases.varlen_lengths(B, L)
    assert sorted(n.tolist()) == [2, 18, 33, 48, 64]
    fns = peers._varlen_impls(case, fastattn)
    packed, padded = fns["fastattn"](1)(), fns["fastattn_padded"](1)()
    cu = np.concatenate([[0], np.cumsum(n)])
    for b in range(B):
        np.testing.assert_allclose(packed[cu[b]:cu[b + 1]],
                                   np.swapaxes(padded[b, :, :n[b]], 0, 1), rtol=1e-5, atol=1e-6)
    assert case.flops() == 4.0 * H * D * sum(x * (x + 1) / 2 for x in n.tolist())
    assert not cases.variant_has_peers("varlen")

"""The benchmark's dask section: its suite, its one line when dask is absent, and
each worker checked against its own bound.

(The section itself starts a cluster and runs for minutes: it is run by hand,
``python -m fastattn bench --suite dask``, not here.)"""

from __future__ import annotations

import sys

from fastattn.bench import cases
from fastattn.bench.dask_section import run_dask_section


def test_dask_section_runs_only_when_asked_for():
    assert "dask" in cases.SECTIONS
    assert cases.suite_sections("dask") == ("dask",)
    assert "dask" not in cases.suite_sections("default")
    assert "dask" not in cases.suite_sections("quick")


def test_without_dask_the_section_is_one_line_naming_the_extra(monkeypatch):
    for name in ("dask", "dask.array", "distributed"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "fastattn.dask", raising=False)
    text = run_dask_section(quick=True)
    assert text.startswith("## Dask")
    assert "skipped" in text and "fastattn[dask]" in text


def _run(share, peak):
    return {"seconds": 2.0, "err": 0.0, "share": share, "peak": peak}


def test_each_worker_s_highest_peak_is_checked_against_its_own_share():
    from fastattn.bench import dask_section as ds
    mib = 2**20
    runs = [_run({"a": 96 * mib, "b": 40 * mib}, {"a": 150 * mib, "b": 120 * mib}),
            _run({"a": 96 * mib, "b": 40 * mib}, {"a": 208 * mib, "b": 125 * mib})]
    results = {label: {"mem": [1.0, 1.0], "runs": runs} for label, _, _ in ds.LAYOUTS}
    timing, memory = ds._rows(results, ["a", "b"])
    assert [r["label"] for r in timing] == [label for label, _, _ in ds.LAYOUTS]
    assert len(memory) == 2 * len(ds.LAYOUTS)
    a, b = memory[:2]
    assert (a["peak"], a["bound"], a["ok"]) == (208 * mib, 208 * mib, True)
    assert (b["peak"], b["bound"], b["ok"]) == (125 * mib, 124 * mib, False)
    table = "\n".join(ds._tables(timing, memory))
    assert "| 1 | 96 | 208 | 208 | yes |" in table and "| 2 | 40 | 125 | 124 | NO |" in table

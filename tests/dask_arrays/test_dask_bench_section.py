"""The benchmark's dask section: its suite, and its one line when dask is absent.

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

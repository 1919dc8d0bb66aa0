"""fastattn.dask without the [dask] extra: importing it says what to install.

Runs whether or not dask is installed (dask is hidden from a subprocess)."""

from __future__ import annotations

from support import run_python


def test_import_without_dask_names_the_extra():
    code = ("import sys\n"
            "for name in ('dask', 'dask.array', 'dask.base', 'dask.highlevelgraph'):\n"
            "    sys.modules[name] = None\n"
            "import fastattn\n"
            "try:\n"
            "    import fastattn.dask\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    r = run_python(code)
    assert "ImportError:" in r.stdout
    assert "fastattn[dask]" in r.stdout and "dask[array]" in r.stdout


def test_fastattn_itself_does_not_import_dask():
    code = "import sys, fastattn; print('dask' in sys.modules)"
    r = run_python(code)
    assert r.stdout.strip() == "False"

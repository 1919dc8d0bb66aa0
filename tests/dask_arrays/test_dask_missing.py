"""fastattn.dask without the [dask] extra: importing it says what to install.

Runs whether or not dask is installed (dask is hidden from a subprocess)."""

from __future__ import annotations

import subprocess
import sys


def test_import_without_dask_names_the_extra():
    code = ("import sys\n"
            "for name in ('dask', 'dask.array', 'dask.base', 'dask.highlevelgraph'):\n"
            "    sys.modules[name] = None\n"
            "import fastattn\n"
            "try:\n"
            "    import fastattn.dask\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ImportError:" in r.stdout
    assert "fastattn[dask]" in r.stdout and "dask[array]" in r.stdout


def test_fastattn_itself_does_not_import_dask():
    code = "import sys, fastattn; print('dask' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"

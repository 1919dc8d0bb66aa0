"""fastattn imports without torch, transformers and dask; fastattn.torch says
it needs torch."""

import subprocess
import sys

CODE = """
import sys
for name in ("torch", "transformers", "dask"):
    sys.modules[name] = None  # an import of it raises ImportError
import fastattn, numpy as np
x = np.ones((3, 2))
assert fastattn.attention(x, x, x).shape == (3, 2)
try:
    import fastattn.torch
except ImportError as e:
    print("refused:", e)
"""


def test_fastattn_imports_without_torch_transformers_dask():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "torch" in r.stdout

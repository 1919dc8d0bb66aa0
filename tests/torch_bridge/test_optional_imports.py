"""fastattn imports without torch, transformers and dask; fastattn.torch says
it needs torch."""

from support import run_python

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
    r = run_python(CODE)
    assert "refused:" in r.stdout and "torch" in r.stdout

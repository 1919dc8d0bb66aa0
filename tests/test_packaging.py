"""Packaging checks.

Two kinds of test live here:

* the *smoke test* of an installed fastattn (``test_smoke_*``): it needs
  nothing but fastattn and NumPy, so it also runs as a plain script,
  ``python tests/test_packaging.py``, which is how .ci/build_wheel.sh and
  cibuildwheel's test-command run it against a freshly installed wheel or
  sdist (no pytest there).  Run it from outside the source tree so that the
  installed package, not the checkout, is imported;
* checks of the source tree's packaging (sdist contents, typing files), run
  by pytest in the normal suite and skipped where the tools are missing.
"""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np

import fastattn
from fastattn._core import ISA_NAMES
from support import run_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])

# The walkthrough's numbers: tokens A, B, C; Q = K = V = X, scale 1/sqrt(2).
ROW_A_UNMASKED = [0.401, 0.198, 0.401]
ROW_B_CAUSAL = [0.330, 0.670, 0.0]

# Run in a child process with a given environment: the default path's
# results of a fixed set of calls, and the path the dispatcher chose.
_CHILD = r"""
import json, sys
import numpy as np
import fastattn
rng = np.random.default_rng(7)
res = {"isa": fastattn.get_isa(), "available": list(fastattn.available_isas())}
for dt in ("float32", "float64"):
    q = rng.standard_normal((2, 3, 37, 24)).astype(dt)
    k = rng.standard_normal((2, 3, 53, 24)).astype(dt)
    v = rng.standard_normal((2, 3, 53, 19)).astype(dt)
    out, w = fastattn.attention(q, k, v, return_weights=True)
    outc = fastattn.attention(q, k, v, is_causal="lower_right")
    s = fastattn.softmax(rng.standard_normal((5, 41)).astype(dt), axis=-1)
    res[dt] = [a.astype("float64").ravel().tolist() for a in (out, w, outc, s)]
x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
res["walk"] = [a.ravel().tolist() for a in fastattn.attention(x, x, x, return_weights=True)]
json.dump(res, sys.stdout)
"""


def _child(**env: str) -> dict:
    p = run_python(_CHILD, env={"FASTATTN_ISA": None, "FASTATTN_DISABLE_CPU_FEATURES": None,
                                **env}, timeout=300)
    return json.loads(p.stdout)


# --------------------------------------------------------------------------
# smoke test of the installed package
# --------------------------------------------------------------------------

def test_smoke_walkthrough() -> None:
    out, w = fastattn.attention(X, X, X, return_weights=True)
    np.testing.assert_allclose(w[0], ROW_A_UNMASKED, atol=1e-3)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(out, w @ X, rtol=1e-12)
    out_c, w_c = fastattn.attention(X, X, X, is_causal=True, return_weights=True)
    np.testing.assert_allclose(w_c[1], ROW_B_CAUSAL, atol=1e-3)
    assert w_c[1, 2] == 0.0 and w_c[0, 1] == 0.0 and w_c[0, 2] == 0.0
    np.testing.assert_allclose(out_c, w_c @ X, rtol=1e-12)
    np.testing.assert_allclose(fastattn.softmax(np.array([0.0, np.log(3.0)])), [0.25, 0.75])


def test_smoke_info() -> None:
    p = run_python(module="fastattn", argv=["info"])
    assert fastattn.__version__ in p.stdout and fastattn.get_isa() in p.stdout, p.stdout
    print(p.stdout, end="")


def test_smoke_every_isa_path() -> None:
    default = _child()
    assert default["isa"] == default["available"][-1]   # the best path by default
    assert default["available"][0] == ISA_NAMES[0]
    for isa in default["available"]:
        got = _child(FASTATTN_ISA=isa)
        assert got["isa"] == isa
        for dt in ("float32", "float64"):
            for a, b in zip(got[dt], default[dt]):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5,
                                           err_msg=f"FASTATTN_ISA={isa}, {dt}")
        np.testing.assert_allclose(got["walk"][1][:3], ROW_A_UNMASKED, atol=1e-3)
        print(f"FASTATTN_ISA={isa}: same results as the default path ({default['isa']})")


def test_smoke_baseline_without_avx() -> None:
    # What a CPU without the features of every path above the baseline (AVX2,
    # AVX-512, ...) sees: detection reports them missing.
    base, *above = ISA_NAMES
    got = _child(FASTATTN_DISABLE_CPU_FEATURES=",".join(above))
    assert got["isa"] == base and got["available"] == [base], got
    best = fastattn.available_isas()[-1]
    if best != base:        # the best path disabled alone: neither offered nor chosen
        got = _child(FASTATTN_DISABLE_CPU_FEATURES=best)
        assert best not in got["available"] and got["isa"] != best, got
    print(f"FASTATTN_DISABLE_CPU_FEATURES={','.join(above)}: baseline path {base!r} selected")


# --------------------------------------------------------------------------
# packaging of the source tree (pytest only)
# --------------------------------------------------------------------------

def _in_checkout() -> bool:
    return os.path.exists(os.path.join(REPO, "setup.py"))


def test_typing_files_present() -> None:
    import pytest
    if not _in_checkout():
        pytest.skip("not in a source checkout")
    for f in ("py.typed", "_core.pyi"):
        assert os.path.exists(os.path.join(REPO, "fastattn", f)), f
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as fh:
        text = fh.read()
    assert "py.typed" in text and "*.pyi" in text      # shipped as package data


def test_stub_names_match_core() -> None:
    """Every public name of the compiled module is in its stub (stubtest in
    .ci/typecheck.sh checks the signatures too)."""
    import ast
    import pytest
    from fastattn import _core
    stub = os.path.join(os.path.dirname(fastattn.__file__), "_core.pyi")
    if not os.path.exists(stub):
        pytest.skip("no stub next to the installed package")
    with open(stub, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in tree.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    names = {n for n in names if not n.startswith("__")}
    runtime = {n for n in dir(_core) if not n.startswith("__")}
    assert runtime <= names, f"missing from fastattn/_core.pyi: {sorted(runtime - names)}"
    assert names <= runtime, f"in fastattn/_core.pyi but not in _core: {sorted(names - runtime)}"


def test_sdist_contents(tmp_path) -> None:
    """The sdist holds every source the build needs and none of its output."""
    import pytest
    if not _in_checkout():
        pytest.skip("not in a source checkout")
    for mod in ("Cython", "setuptools"):
        pytest.importorskip(mod)
    if run_python("import build.__main__", check=False).returncode:
        pytest.skip("the 'build' package (PyPI: build) is not installed")
    run_python(module="build", argv=["--sdist", "--no-isolation", "--outdir", tmp_path, REPO],
               timeout=600)
    (sdist,) = tmp_path.glob("fastattn-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    need = {"setup.py", "pyproject.toml", "fastattn/_core.pyx", "fastattn/_core.pxd",
            "fastattn/_testing.pyx", "fastattn/py.typed", "fastattn/_core.pyi",
            "fastattn/__init__.py"}
    src_c = os.path.join(REPO, "src_c")
    need |= {os.path.relpath(os.path.join(d, f), REPO).replace(os.sep, "/")
             for d, _, files in os.walk(src_c) for f in files
             if f.endswith((".c", ".h", ".flags"))}
    assert need <= names, f"missing from the sdist: {sorted(need - names)}"
    bad = sorted(n for n in names if n.endswith((".so", ".pyd", ".o", ".dylib", ".dll"))
                 or n in ("fastattn/_core.c", "fastattn/_testing.c", "fastattn/_build_config.py")
                 or n.startswith(("build/", "dist/")) or "__pycache__" in n)
    assert not bad, f"build output in the sdist: {bad}"


if __name__ == "__main__":
    # The smoke test, without pytest: python tests/test_packaging.py
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.dirname(fastattn.__file__)
    if os.path.dirname(src) == os.path.dirname(here):
        print(f"note: testing the source tree's fastattn ({src}), not an installed one")
    print(f"fastattn {fastattn.__version__} from {src}")
    for name, fn in sorted(globals().items()):
        if name.startswith("test_smoke_") and callable(fn):
            fn()
            print(f"ok  {name}")
    print("smoke test passed")

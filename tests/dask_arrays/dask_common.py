"""Helpers of the fastattn.dask tests: the skip when the extra is absent,
inputs as NumPy and Dask arrays, and the comparisons."""

from __future__ import annotations

import numpy as np
import pytest

REASON = "fastattn.dask needs dask[array] (pip install 'fastattn[dask]')"
CLUSTER_REASON = ("the cluster tests need distributed and cloudpickle "
                  "(pip install 'fastattn[dask]')")


def import_dask():
    """dask.array, or skip the test module naming the missing package."""
    return pytest.importorskip("dask.array", reason=REASON)


def inputs(rng, qshape, kshape, vshape, dtype=np.float32):
    return tuple(rng.standard_normal(s).astype(dtype) for s in (qshape, kshape, vshape))


def chunked(da, arrays, chunks):
    return tuple(da.from_array(a, chunks=c) for a, c in zip(arrays, chunks))


# float32 rounding of the in-memory call: the merge adds a few roundings
# (an exp, a division and a product per part and level).
TOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 3e-5, np.dtype(np.float64): 1e-12}


def assert_matches(out, lse, want, want_lse, dtype):
    """out/lse equal the in-memory (or reference) results to rounding; -inf
    and NaN at the same places."""
    t = TOL[np.dtype(dtype)]
    assert out.shape == want.shape and out.dtype == want.dtype, (out.shape, out.dtype,
                                                                 want.shape, want.dtype)
    np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), rtol=t, atol=t)
    if lse is not None:
        assert lse.shape == want_lse.shape and lse.dtype == want_lse.dtype
        np.testing.assert_allclose(lse.astype(np.float64), want_lse.astype(np.float64),
                                   rtol=t, atol=t)


def partial_tasks(arr) -> list:
    """The keys of the partial-attention tasks in arr's graph (one per
    query block and key chunk: each computes its partial and merges it)."""
    return list(chain_steps(arr))


def chain_steps(arr) -> dict:
    """The partial-and-merge tasks of arr's graph: {key: the key of the
    running result it merges into, or None at a block's first key chunk}."""
    from fastattn import _dask_tasks
    graph = arr.__dask_graph__()
    steps = {}
    for name, layer in graph.layers.items():
        if not name.startswith("fastattn-partial-"):
            continue
        for key, task in layer.items():
            f = task[0] if isinstance(task, tuple) else None
            if getattr(f, "func", None) is _dask_tasks.accumulate:
                steps[key] = task[1]
    return steps

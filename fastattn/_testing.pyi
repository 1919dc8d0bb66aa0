"""Type stubs for fastattn._testing (fastattn/_testing.pyx): the test hooks
into the C kernels of fastattn._core.  Not part of the API.  CI checks the
two agree with ``python -m mypy.stubtest fastattn._testing``
(.ci/typecheck.sh).
"""

from typing import Any

import numpy.typing as npt

__test__: dict[str, str]  # added by Cython to every module (its doctest table)

def exp(x: npt.NDArray[Any], base2: bool) -> npt.NDArray[Any]: ...
def tanh(x: npt.NDArray[Any]) -> npt.NDArray[Any]: ...
def bf16_op(name: str, native: bool, a: npt.NDArray[Any], b: npt.NDArray[Any],
            c: npt.NDArray[Any]) -> bool: ...
def fail_alloc_after(n_ok: int) -> None: ...

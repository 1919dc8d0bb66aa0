"""Type stubs for the compiled bridge fastattn._core (fastattn/_core.pyx).

Private to the package: fastattn/_api.py validates every argument before it
reaches these functions.  Keep in step with _core.pyx; CI checks the two
agree with ``python -m mypy.stubtest fastattn._core`` (.ci/typecheck.sh).
"""

from typing import Any, Final

import numpy as np
import numpy.typing as npt

_Array = npt.NDArray[Any]

MAX_BATCH_DIMS: Final[int]
UNBOUNDED: Final[int]
__test__: dict[str, str]  # added by Cython to every module (its doctest table)
# added by Cython: the C-level functions of _core.pxd, as capsules (for cimport)
__pyx_capi__: dict[str, Any]
ISA_NAMES: Final[tuple[str, ...]]  # every line of src_c/runtime/isa_list.h, in order
BUILT_ISAS: Final[tuple[str, ...]]  # those compiled into this extension (its target's arch)

def attention(
    q: _Array,
    k: _Array,
    v: _Array,
    out: _Array | None,
    *,
    batch: tuple[int, ...],
    scale: float,
    causal: bool = ...,
    causal_offset: int = ...,
    win_left: int = ...,
    win_right: int = ...,
    bool_mask: _Array | None = ...,
    add_mask: _Array | None = ...,
    pad: _Array | None = ...,
    weights: _Array | None = ...,
    num_threads: int = ...,
    softcap: float = ...,
    alibi: _Array | None = ...,
    sinks: _Array | None = ...,
    lse: _Array | None = ...,
    seqs: tuple[_Array, _Array, bool] | None = ...,
) -> _Array: ...
def attention_backward(
    q: _Array,
    k: _Array,
    v: _Array,
    out: _Array,
    lse: _Array,
    dout: _Array,
    dq: _Array,
    dk: _Array,
    dv: _Array,
    *,
    batch: tuple[int, ...],
    scale: float,
    causal: bool = ...,
    causal_offset: int = ...,
    win_left: int = ...,
    win_right: int = ...,
    bool_mask: _Array | None = ...,
    add_mask: _Array | None = ...,
    pad: _Array | None = ...,
    num_threads: int = ...,
    softcap: float = ...,
    alibi: _Array | None = ...,
    sinks: _Array | None = ...,
    glse: _Array | None = ...,
    dsinks: _Array | None = ...,
    dmask: _Array | None = ...,
    seqs: tuple[_Array, _Array, bool] | None = ...,
) -> None: ...
def backward_rounds(x: _Array) -> bool: ...
def round_half(x: _Array, y: _Array) -> None: ...
def in_kernel_form(q: _Array, k: _Array, v: _Array, dtype: np.dtype[Any]) -> bool: ...
def softmax_rows(
    x: _Array, y: _Array, *, keep: npt.NDArray[np.uint8] | None = ..., num_threads: int = ...
) -> None: ...
def cpu_supports(name: str) -> bool: ...
def get_isa() -> str: ...
def set_isa(name: str) -> None: ...
def avx512_emulated() -> bool: ...
def neon_emulated() -> bool: ...
def amx_fp16() -> bool: ...
def openmp_enabled() -> bool: ...
def openmp_max_threads() -> int: ...
def set_default_threads(n: int) -> None: ...
def openmp_runtime() -> str: ...
def fma_probe(dtype: str, n: int, num_threads: int) -> float: ...
def read_probe(a: _Array, num_threads: int) -> int: ...
def decode_q8(
    q: _Array,
    k: _Array,
    k_scale: _Array,
    v: _Array,
    v_scale: _Array,
    out: _Array,
    *,
    lse: _Array | None = ...,
    scale: float,
    causal: bool = ...,
    causal_offset: int = ...,
    win_left: int = ...,
    win_right: int = ...,
    pad: _Array | None = ...,
    softcap: float = ...,
    alibi: _Array | None = ...,
    sinks: _Array | None = ...,
    num_threads: int = ...,
) -> None: ...
def quantize_q8(x: _Array, y: _Array, scale: _Array) -> None: ...
def paged_append(
    k: _Array,
    v: _Array,
    k_scale: _Array | None,
    v_scale: _Array | None,
    slots: _Array,
    key: _Array,
    value: _Array,
    num_threads: int = ...,
) -> None: ...
def attention_paged(
    q: _Array,
    k: _Array,
    v: _Array,
    k_scale: _Array | None,
    v_scale: _Array | None,
    table: _Array,
    seq_lens: _Array,
    cu_q: _Array,
    out: _Array,
    lse: _Array | None,
    *,
    scale: float,
    causal: bool = ...,
    win_left: int = ...,
    win_right: int = ...,
    softcap: float = ...,
    alibi: _Array | None = ...,
    sinks: _Array | None = ...,
    num_threads: int = ...,
) -> None: ...

"""Typing example: every public function of fastattn, used as a user would.

Checked by ``mypy --strict`` in .ci/typecheck.sh (with the [tool.mypy]
configuration of pyproject.toml): the public signatures must be precise
enough for a strictly typed caller -- no ``Any`` leaking into its code, the
``return_weights`` overloads giving an array or a pair of arrays.  It also
runs: ``python tests/typing_example.py``.  Not collected by pytest (the name
does not start with ``test_``).
"""

from __future__ import annotations

import inspect

import numpy as np
import numpy.typing as npt

import fastattn
from fastattn import KVCache
from fastattn.trace import trace_backward

F64 = npt.NDArray[np.float64]


def walkthrough() -> tuple[npt.NDArray[np.floating], npt.NDArray[np.floating]]:
    x: F64 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out: npt.NDArray[np.floating] = fastattn.attention(x, x, x)
    both = fastattn.attention(x, x, x, is_causal=True, return_weights=True)
    out_c, weights = both                      # a pair only with return_weights=True
    assert out.shape == out_c.shape == (3, 2)
    flag: bool = bool(np.random.default_rng(0).integers(2))
    either = fastattn.attention(x, x, x, return_weights=flag)   # plain bool: either form
    if isinstance(either, tuple):
        either = either[0]
    fastattn.attention(x, [[1.0, 0.0]], [[2.0, 3.0]], attn_mask=np.ones((3, 1), bool),
                       is_causal="lower_right", scale=0.5, enable_gqa=False,
                       key_padding_mask=None, out=np.empty((3, 2)), num_threads=1)
    return out_c, weights


def softmax() -> npt.NDArray[np.floating]:
    y = fastattn.softmax(np.array([1.0, 2.0, 3.0]))
    y2 = fastattn.softmax([[0.0, 1.0]], axis=-1, mask=np.array([True, False]))
    fastattn.softmax(y, axis=(0,), out=np.empty(3))
    assert y2.shape == (1, 2)
    return y


def varlen() -> npt.NDArray[np.floating]:
    rng = np.random.default_rng(0)
    cu = np.array([0, 2, 5], dtype=np.int32)
    q, kv = rng.standard_normal((5, 4, 8)), rng.standard_normal((5, 2, 8))
    out = fastattn.attention_varlen(q, kv, kv, cu, cu, is_causal=True, scale=0.5,
                                    out=np.empty((5, 4, 8)), num_threads=1)
    if "return_lse" in inspect.signature(fastattn.attention).parameters:   # once it has it
        out2, lse = fastattn.attention_varlen(q, kv, kv, cu, cu, return_lse=True)
        print(out2.shape, lse.shape)
    return out


def paged() -> npt.NDArray[np.floating]:
    cache = fastattn.PagedKVCache(8, 4, 2, 8, num_layers=2, dtype="bfloat16", layout="HND")
    rng = np.random.default_rng(0)
    a = cache.add()
    for layer in (0, 1):
        cache.append(a, rng.standard_normal((6, 2, 8)), rng.standard_normal((6, 2, 8)),
                     layer=layer)
    b = cache.fork(a)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    out: npt.NDArray[np.floating] = cache.attend(q, [a, b], layer=1, window=(3, 0))
    kc, vc = np.zeros((4, 16, 2, 8), np.float32), np.zeros((4, 16, 2, 8), np.float32)
    fastattn.paged_append(kc, vc, np.array([0, 17]), np.ones((2, 2, 8)), np.ones((2, 2, 8)))
    table, lens = np.array([[0], [1]], np.int32), np.array([1, 2])
    out2 = fastattn.attention_paged(q, kc, vc, table, lens, softcap=5.0, num_threads=1)
    out3, lse = fastattn.attention_paged(q, kc, vc, table, lens, return_lse=True)
    print(out.shape, out2.shape, out3.shape, lse.shape)
    cache.free(a)
    return out2


def backward() -> npt.NDArray[np.floating]:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 3))
    out, lse = fastattn.attention(q, q, q, is_causal=True, sinks=[0.0, 1.0], return_lse=True)
    grads = fastattn.attention_backward(np.ones_like(out), q, q, q, out, lse, None, True,
                                        sinks=[0.0, 1.0], grad_lse=np.zeros_like(lse),
                                        window=(2, None), num_threads=1)
    d_q: npt.NDArray[np.floating] = grads[0]
    print(len(grads), d_q.shape)
    return d_q


def config() -> None:
    isa: str = fastattn.get_isa()
    isas: tuple[str, ...] = fastattn.available_isas()
    fastattn.set_isa(isas[0])
    fastattn.set_isa(isa)
    omp: bool = fastattn.openmp_enabled()
    fastattn.show_config()
    version: str = fastattn.__version__
    print(isa, isas, omp, version)


def multi_head() -> npt.NDArray[np.floating]:
    rng = np.random.default_rng(0)
    d_model, heads, kv_heads, d_k = 8, 4, 2, 2
    x = rng.standard_normal((1, 5, d_model))
    w_q = rng.standard_normal((d_model, heads * d_k))
    w_kv = rng.standard_normal((d_model, kv_heads * d_k))
    w_o = rng.standard_normal((heads * d_k, d_model))
    out = fastattn.multi_head_attention(x, w_q, w_kv, w_kv, w_o, heads,
                                        num_kv_heads=kv_heads, is_causal=True)
    _, w = fastattn.multi_head_attention(x, w_q, w_kv, w_kv, w_o, heads,
                                         num_kv_heads=kv_heads, return_weights=True)
    cache = KVCache(1, kv_heads, d_k, max_len=5, dtype=np.float64)
    step = fastattn.multi_head_attention(x[:, :3], w_q, w_kv, w_kv, w_o, heads,
                                         num_kv_heads=kv_heads, kv_cache=cache)
    n: int = len(cache)
    keys: npt.NDArray[np.floating] = cache.keys
    cache.append(np.zeros((1, kv_heads, 1, d_k)), np.zeros((1, kv_heads, 1, d_k)))
    cache.reset()
    c8 = KVCache(1, kv_heads, d_k, max_len=5, dtype="int8")
    c8.append(np.ones((1, kv_heads, 2, d_k)), np.ones((1, kv_heads, 2, d_k)))
    scales: npt.NDArray[np.float32] = c8.key_scales
    dec = c8.attend(np.ones((1, heads, 1, d_k), np.float32), num_threads=1)
    print(n, keys.shape, step.shape, w.shape, cache.max_len, cache.dtype, scales.shape,
          dec.shape)
    return out


def trace() -> None:
    t = fastattn.trace(is_causal=True)
    weights: npt.NDArray[np.float64] = t["weights"]
    t2 = fastattn.trace([[1.0, 0.0], [0.0, 1.0]], scale=1.0)
    g = trace_backward(t, [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    d_q: npt.NDArray[np.float64] = g["dQ"]
    print(weights.shape, t2["output"].shape, d_q.shape)


if __name__ == "__main__":
    walkthrough()
    softmax()
    varlen()
    paged()
    backward()
    config()
    multi_head()
    trace()
    print("typing example ran")

"""A ragged nested list (one NumPy cannot make an array of) passed to any
entry point other than fastattn.attention (whose arguments
test_validation_shapes.py covers): a ValueError that names the argument,
never NumPy's bare message."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn

RAGGED = [[[1.0, 2.0]], [[1.0]]]


def _varlen():
    x = np.ones((2, 1, 2))
    return dict(query=x, key=x, value=x, cu_seqlens_q=np.array([0, 2]),
                cu_seqlens_k=np.array([0, 2]))


def _backward():
    q = np.ones((1, 2, 2))
    out, lse = fastattn.attention(q, q, q, return_lse=True)
    return dict(grad_out=out, query=q, key=q, value=q, out=out, lse=lse)


def _varlen_backward():
    a = _varlen()
    out, lse = fastattn.attention_varlen(**a, return_lse=True)
    return dict(grad_out=out, query=a["query"], key=a["key"], value=a["value"], out=out,
                lse=lse, cu_seqlens_q=a["cu_seqlens_q"], cu_seqlens_k=a["cu_seqlens_k"])


def _paged():
    kc = np.zeros((2, 4, 1, 2), np.float32)
    return dict(query=np.ones((1, 1, 2), np.float32), key_cache=kc, value_cache=kc,
                block_table=np.array([[0]]), seq_lens=np.array([1]))


CASES = [
    (fastattn.attention_varlen, _varlen, "query"),
    (fastattn.attention_varlen, _varlen, "value"),
    (fastattn.attention_varlen, _varlen, "cu_seqlens_k"),
    (fastattn.attention_backward, _backward, "grad_out"),
    (fastattn.attention_backward, _backward, "out"),
    (fastattn.attention_backward, _backward, "lse"),
    (fastattn.attention_backward, _backward, "grad_lse"),
    (fastattn.attention_varlen_backward, _varlen_backward, "grad_out"),
    (fastattn.attention_varlen_backward, _varlen_backward, "key"),
    (fastattn.attention_paged, _paged, "query"),
    (fastattn.attention_paged, _paged, "block_table"),
    (fastattn.attention_paged, _paged, "seq_lens"),
]


@pytest.mark.parametrize("func, make, name", CASES,
                         ids=[f"{f.__name__}-{n}" for f, _, n in CASES])
def test_ragged_nested_list_raises_value_error_naming_the_argument(func, make, name):
    args = make()
    args[name] = RAGGED if name not in ("block_table", "seq_lens", "cu_seqlens_k") \
        else [[0, 1], [2]]
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        func(**args)


@pytest.mark.parametrize("name", ["x", "mask"])
def test_softmax_ragged_nested_list_names_the_argument(name):
    args = dict(x=np.ones((2, 2)), mask=None)
    args[name] = [[1.0, 2.0], [3.0]] if name == "x" else [[True, False], [True]]
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        fastattn.softmax(**args)


@pytest.mark.parametrize("dtype", [np.float32, "int8"])
@pytest.mark.parametrize("name", ["keys", "values", "query"])
def test_kvcache_ragged_nested_list_names_the_argument(name, dtype):
    cache = fastattn.KVCache(1, 1, 2, 4, dtype=dtype)
    rows = np.ones((1, 1, 1, 2), np.float32)
    args = dict(keys=rows, values=rows)
    if name == "query":
        cache.append(rows, rows)
        with pytest.raises(ValueError, match="^query cannot be made an array"):
            cache.attend([[[[1.0, 2.0]], [[1.0]]]])
        return
    args[name] = [[[[1.0, 2.0]], [[1.0]]]]
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        cache.append(args["keys"], args["values"])
    assert len(cache) == 0


@pytest.mark.parametrize("name", ["key", "value"])
def test_paged_kv_cache_append_ragged_names_the_argument_and_takes_no_block(name):
    cache = fastattn.PagedKVCache(4, 4, 1, 2)
    a = cache.add()
    rows = dict(key=np.ones((1, 1, 2), np.float32), value=np.ones((1, 1, 2), np.float32))
    rows[name] = RAGGED
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        cache.append(a, rows["key"], rows["value"])
    assert cache.num_free_blocks == 4

"""Argument validation of fastattn.attention: shapes of the inputs, the masks
and the heads.

Every error is a ValueError raised before anything is written (a given
``out`` keeps its sentinel); its message names the argument and shows the
shapes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import fastattn
import fastattn._core as _core
from api_common import KS, QS, _qkv, _raises


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [(), (2,)], ids=["unbatched", "batched"])
@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_one_dimensional_input_raises_value_error(which, batch):
    args = dict(zip(("query", "key", "value"),
                    _qkv(qs=batch + (3, 4), ks=batch + (5, 4), vs=batch + (5, 6))))
    args[which] = args[which][(0,) * (len(batch) + 1)]
    _raises(ValueError, [which], [args[which].shape], args["query"], args["key"], args["value"],
            out_shape=batch + (3, 6))


@pytest.mark.parametrize("scalar", [1.0, np.float64(1.0)], ids=["python_float", "numpy_float64"])
@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_scalar_input_raises_value_error(which, scalar):
    args = dict(zip(("query", "key", "value"), _qkv()))
    args[which] = scalar
    _raises(ValueError, [which, "()"], [], args["query"], args["key"], args["value"])


def test_key_feature_dim_mismatch_raises_value_error():
    q, k, v = _qkv()
    _raises(ValueError, ["key", "query"], [QS, (2, 5, 3)], q, k[..., :3], v)


@pytest.mark.parametrize("rows", [4, 6], ids=["fewer_rows", "more_rows"])
def test_value_row_count_mismatch_raises_value_error(rows):
    q, k, v = _qkv(vs=(2, rows, 6))
    _raises(ValueError, ["value", "key"], [KS, (2, rows, 6)], q, k, v)


def test_batch_dims_do_not_broadcast_raises_value_error():
    q, k, v = _qkv()
    k3, v3 = np.concatenate([k, k[:1]]), np.concatenate([v, v[:1]])
    _raises(ValueError, ["query", "key"], [QS, (3, 5, 4), (3, 5, 6)], q, k3, v3)


def test_value_leading_dims_do_not_broadcast():
    q, k, v = _qkv(qs=(2, 3, 4), ks=(2, 5, 4), vs=(3, 5, 6))
    with pytest.raises(ValueError, match="value"):
        fastattn.attention(q, k, v)


def test_too_many_leading_dims_raises_value_error():
    nd = _core.MAX_BATCH_DIMS + 1
    try:
        q = np.ones((1,) * nd + (3, 4))
    except ValueError:  # NumPy 1.x: at most 32 dimensions, so no input exceeds the limit
        pytest.skip(f"NumPy {np.__version__} cannot hold {nd + 2} dimensions")
    k, v = np.ones((5, 4)), np.ones((5, 6))
    _raises(ValueError, ["dimensions"], [], q, k, v, out_shape=None)


@pytest.mark.parametrize("name", ["query", "key", "value", "attn_mask", "key_padding_mask",
                                  "alibi_slopes", "sinks"])
def test_ragged_nested_list_raises_value_error_naming_the_argument(name):
    q, k, v = _qkv()
    args = {"query": q, "key": k, "value": v}
    ragged = [[1.0, 2.0], [3.0]] if name != "key_padding_mask" else [[True, False], [True]]
    args[name] = ragged
    with pytest.raises(ValueError, match=f"^{name} cannot be made an array"):
        fastattn.attention(**args)


# ---------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mshape", [(3, 4), (3, 6), (4, 5), (5, 3), (3, 2, 5), (1, 2, 3, 5),
                                    (3, 2, 3, 5), (2,), (4,)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask_wrong_shape_raises_value_error(mshape, kind):
    q, k, v = _qkv()
    m = np.ones(mshape, dtype=bool) if kind == "bool" else np.zeros(mshape)
    _raises(ValueError, ["attn_mask"], [mshape, (2, 3, 5)], q, k, v, m)


def test_attn_mask_would_grow_batch():
    """A mask with more leading dims than the inputs may not add a batch."""
    q, k, v = _qkv(qs=(3, 4), ks=(5, 4), vs=(5, 6))
    m = np.ones((2, 3, 5), dtype=bool)
    _raises(ValueError, ["attn_mask"], [m.shape], q, k, v, out_shape=(3, 6), attn_mask=m)


@pytest.mark.parametrize("kshape", [(4,), (6,), (3, 5), (2, 4), (2, 1, 5), (1, 2, 5), ()])
def test_key_padding_mask_wrong_shape_raises_value_error(kshape):
    q, k, v = _qkv()
    _raises(ValueError, ["key_padding_mask"], [kshape], q, k, v,
            key_padding_mask=np.zeros(kshape, bool))


def test_key_padding_mask_2d_needs_3d_query():
    q, k, v = _qkv(qs=(3, 4), ks=(5, 4), vs=(5, 6))
    kpm = np.zeros((1, 5), dtype=bool)
    _raises(ValueError, ["key_padding_mask"], [kpm.shape], q, k, v, out_shape=(3, 6),
            key_padding_mask=kpm)


# ---------------------------------------------------------------------------
# heads (enable_gqa)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("hq,hkv", [(3, 2), (4, 3), (2, 4), (5, 0), (6, 4), (8, 3), (5, 2)])
def test_enable_gqa_non_dividing_heads_raises_value_error(hq, hkv):
    q, k, v = _qkv(qs=(1, hq, 3, 4), ks=(1, hkv, 5, 4), vs=(1, hkv, 5, 6))
    msg = _raises(ValueError, ["enable_gqa", "heads"], [(1, hq, 3, 4), (1, hkv, 5, 4)], q, k, v,
                  enable_gqa=True, out_shape=(1, hq, 3, 6))
    assert str(hq) in msg and str(hkv) in msg, msg


def test_gqa_key_value_heads_differ():
    q, k, v = _qkv(qs=(1, 8, 3, 4), ks=(1, 2, 5, 4), vs=(1, 4, 5, 6))
    with pytest.raises(ValueError):
        fastattn.attention(q, k, v, enable_gqa=True)


def test_gqa_heads_without_flag_do_not_broadcast():
    q, k, v = _qkv(qs=(1, 8, 3, 4), ks=(1, 2, 5, 4), vs=(1, 2, 5, 6))
    _raises(ValueError, [], [], q, k, v, out_shape=(1, 8, 3, 6))


def test_enable_gqa_without_head_dimension_raises_value_error():
    q, k, v = _qkv(qs=(3, 4), ks=(5, 4), vs=(5, 6))
    _raises(ValueError, ["enable_gqa"], [(3, 4)], q, k, v, enable_gqa=True, out_shape=(3, 6))


# ---------------------------------------------------------------------------
# messages
# ---------------------------------------------------------------------------

def test_error_messages_do_not_leak_internal_names():
    """The message is about the caller's arguments, not _core internals."""
    q, k, v = _qkv()
    with pytest.raises(ValueError) as info:
        fastattn.attention(q, k, v, np.ones((3, 4), bool))
    assert not re.search(r"_core|fa_attention|status \d", str(info.value))

"""Argument validation of ``window`` (fastattn.attention, multi_head_attention
and the reference, which share one validator in fastattn._masks).

A bool, a non-integer type or a malformed pair is a TypeError or ValueError
naming ``window``, raised before anything is written (a given ``out`` keeps
its sentinel) and, with a KV cache, before anything is appended.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
import fastattn.reference as reference
from api_common import _qkv, _raises

BAD_TYPE = {
    "bool_true": True,
    "bool_false": False,
    "numpy_bool": np.bool_(True),
    "float_integral": 3.0,
    "float_fraction": 2.5,
    "numpy_float": np.float32(4.0),
    "string": "8",
    "bool_in_pair": (True, 2),
    "float_in_pair": (2, 1.5),
    "string_in_pair": ("1", None),
    "dict": {"left": 1},
    "complex": 1 + 0j,
}
BAD_VALUE = {
    "negative": -1,
    "negative_left": (-1, 0),
    "negative_right": (0, -5),
    "numpy_negative": np.int64(-2),
    "nan": float("nan"),
    "inf": float("inf"),
    "minus_inf_in_pair": (float("-inf"), 3),
    "nan_in_pair": (1, np.float64("nan")),
    "empty_pair": (),
    "one_item": (3,),
    "three_items": (1, 2, 3),
}


@pytest.mark.parametrize("bad", BAD_TYPE.values(), ids=BAD_TYPE.keys())
def test_window_of_bad_type_raises_type_error_out_untouched(bad):
    _raises(TypeError, ["window"], [], *_qkv(), window=bad)


@pytest.mark.parametrize("bad", BAD_VALUE.values(), ids=BAD_VALUE.keys())
def test_window_of_bad_value_raises_value_error_out_untouched(bad):
    _raises(ValueError, ["window"], [], *_qkv(), window=bad)


@pytest.mark.parametrize("bad, exc", [(True, TypeError), (-1, ValueError),
                                      ((1, 2, 3), ValueError), (0.5, TypeError)],
                         ids=["bool", "negative", "three_items", "float"])
def test_window_errors_with_masks_and_weights_out_untouched(bad, exc):
    q, k, v = _qkv()
    _raises(exc, ["window"], [], q, k, v, np.ones((3, 5), bool), window=bad,
            return_weights=True, is_causal="lower_right")


@pytest.mark.parametrize("bad, exc", [(True, TypeError), (-3, ValueError),
                                      (float("inf"), ValueError), ("2", TypeError)],
                         ids=["bool", "negative", "inf", "string"])
def test_reference_shares_the_window_validation(bad, exc):
    with pytest.raises(exc, match="window"):
        reference.attention(*_qkv(), window=bad)


@pytest.mark.parametrize("good", [0, 7, np.int32(3), (None, 2), (2, None), (None, None),
                                  [1, 1], 2**40],
                         ids=["zero", "int", "numpy_int", "right_only", "left_only",
                              "both_none", "list", "huge"])
def test_window_good_values_accepted(good):
    q, k, v = _qkv()
    got = fastattn.attention(q, k, v, window=good)
    np.testing.assert_allclose(got, reference.attention(q, k, v, window=good), rtol=1e-12,
                               atol=1e-12)


def test_window_wider_than_int64_is_unbounded():
    q, k, v = _qkv()
    assert np.array_equal(fastattn.attention(q, k, v, window=(2**70, 2**64)),
                          fastattn.attention(q, k, v))


def test_bad_window_in_multi_head_attention_leaves_the_cache_unchanged():
    rng = np.random.default_rng(0)
    d, h = 16, 2
    x = rng.standard_normal((1, 3, d))
    w = rng.standard_normal((d, d)) / 4
    cache = fastattn.KVCache(1, h, d // h, max_len=10, dtype=np.float64)
    with pytest.raises(ValueError, match="window"):
        fastattn.multi_head_attention(x, w, w, w, w, h, kv_cache=cache, window=-1)
    with pytest.raises(TypeError, match="window"):
        fastattn.multi_head_attention(x, w, w, w, w, h, kv_cache=cache, window=(1.5, 0))
    assert len(cache) == 0

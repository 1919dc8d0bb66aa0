"""Every documented error of fastattn.attention / fastattn.softmax / set_isa.

Each error names the offending argument (and, for shape errors, the shapes),
and is raised before anything is written: a given ``out`` keeps its sentinel.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
from conftest import mentions_shape

SENTINEL = -12345.0


def _qkv(qshape=(2, 3, 4), kshape=(2, 5, 4), vshape=(2, 5, 6), dtype=np.float64):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(qshape).astype(dtype), rng.standard_normal(kshape).astype(dtype),
            rng.standard_normal(vshape).astype(dtype))


def _sentinel_out(shape, dtype=np.float64):
    return np.full(shape, SENTINEL, dtype=dtype)


def _raises_untouched(exc, names, shapes, q, k, v, out_shape=None, out_dtype=np.float64, **kwargs):
    """Call attention with a sentinel ``out`` (when a valid one exists) and check."""
    out = None
    if out_shape is not None and "out" not in kwargs:
        out = _sentinel_out(out_shape, out_dtype)
        kwargs["out"] = out
    with pytest.raises(exc) as info:
        fastattn.attention(q, k, v, **kwargs)
    msg = str(info.value)
    for name in names:
        assert name in msg, f"message does not name {name!r}: {msg!r}"
    for shape in shapes:
        assert mentions_shape(msg, shape), f"message does not show shape {shape}: {msg!r}"
    if out is not None:
        assert np.all(out == SENTINEL), "out was written before the error"
    target = kwargs.get("out")
    if target is not None and target is not out and isinstance(target, np.ndarray):
        assert np.all(target == SENTINEL), "out was written before the error"
    return msg


# ---------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------

def test_mismatched_embedding_dim():
    q, k, v = _qkv((2, 3, 4), (2, 5, 3), (2, 5, 6))
    _raises_untouched(ValueError, ["key"], [k.shape], q, k, v, out_shape=(2, 3, 6))


def test_mismatched_sequence_length():
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), (2, 6, 6))
    _raises_untouched(ValueError, ["value"], [v.shape], q, k, v, out_shape=(2, 3, 6))


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_fewer_than_two_dims(which):
    q, k, v = _qkv((3, 4), (5, 4), (5, 4))
    args = {"query": q, "key": k, "value": v}
    args[which] = args[which][0]
    _raises_untouched(ValueError, [which], [args[which].shape], args["query"], args["key"], args["value"],
                      out_shape=(3, 4) if which != "query" else None)


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_zero_dim_input(which):
    q, k, v = _qkv((3, 4), (5, 4), (5, 4))
    args = {"query": q, "key": k, "value": v}
    args[which] = np.float64(1.0)
    with pytest.raises(ValueError, match=which):
        fastattn.attention(args["query"], args["key"], args["value"])


def test_leading_dims_do_not_broadcast():
    q, k, v = _qkv((2, 3, 4), (3, 5, 4), (3, 5, 6))
    with pytest.raises(ValueError) as info:
        fastattn.attention(q, k, v)
    msg = str(info.value)
    assert mentions_shape(msg, q.shape) or mentions_shape(msg, k.shape) or \
        mentions_shape(msg, q.shape[:-2]) or mentions_shape(msg, k.shape[:-2]), msg


def test_value_leading_dims_do_not_broadcast():
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), (3, 5, 6))
    with pytest.raises(ValueError, match="value"):
        fastattn.attention(q, k, v)


@pytest.mark.parametrize("mshape", [(3, 6), (4, 5), (5, 3), (3, 2, 3, 5), (2,)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask_does_not_broadcast(mshape, kind):
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), (2, 5, 6))
    m = np.ones(mshape, dtype=bool) if kind == "bool" else np.zeros(mshape)
    _raises_untouched(ValueError, ["attn_mask"], [mshape], q, k, v, out_shape=(2, 3, 6), attn_mask=m)


def test_attn_mask_would_grow_batch():
    """A mask with more leading dims than the inputs may not add a batch."""
    q, k, v = _qkv((3, 4), (5, 4), (5, 6))
    m = np.ones((2, 3, 5), dtype=bool)
    _raises_untouched(ValueError, ["attn_mask"], [m.shape], q, k, v, out_shape=(3, 6), attn_mask=m)


@pytest.mark.parametrize("kshape", [(4,), (6,), (2, 4), (3, 5), (1, 2, 5)])
def test_key_padding_mask_wrong_shape(kshape):
    q, k, v = _qkv((2, 3, 4), (2, 5, 4), (2, 5, 6))
    kpm = np.zeros(kshape, dtype=bool)
    _raises_untouched(ValueError, ["key_padding_mask"], [kshape], q, k, v, out_shape=(2, 3, 6),
                      key_padding_mask=kpm)


def test_key_padding_mask_2d_needs_3d_query():
    q, k, v = _qkv((3, 4), (5, 4), (5, 6))
    kpm = np.zeros((1, 5), dtype=bool)
    _raises_untouched(ValueError, ["key_padding_mask"], [kpm.shape], q, k, v, out_shape=(3, 6),
                      key_padding_mask=kpm)


@pytest.mark.parametrize("hq,hkv", [(6, 4), (8, 3), (2, 4), (5, 2)])
def test_gqa_heads_do_not_divide(hq, hkv):
    q, k, v = _qkv((1, hq, 3, 4), (1, hkv, 5, 4), (1, hkv, 5, 6))
    _raises_untouched((ValueError, TypeError), [], [], q, k, v, out_shape=(1, hq, 3, 6), enable_gqa=True)
    with pytest.raises((ValueError, TypeError)) as info:
        fastattn.attention(q, k, v, enable_gqa=True)
    msg = str(info.value)
    assert str(hq) in msg and str(hkv) in msg, msg


def test_gqa_key_value_heads_differ():
    q, k, v = _qkv((1, 8, 3, 4), (1, 2, 5, 4), (1, 4, 5, 6))
    with pytest.raises(ValueError):
        fastattn.attention(q, k, v, enable_gqa=True)


def test_gqa_heads_without_flag_do_not_broadcast():
    q, k, v = _qkv((1, 8, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6))
    _raises_untouched(ValueError, [], [], q, k, v, out_shape=(1, 8, 3, 6))


# ---------------------------------------------------------------------------
# out=
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 6), (3, 6), (1, 3, 6), (2, 2, 3, 6)])
def test_out_wrong_shape(shape):
    q, k, v = _qkv()
    out = _sentinel_out(shape)
    _raises_untouched(ValueError, ["out"], [shape], q, k, v, out=out)


@pytest.mark.parametrize("odt", [np.float32, np.float16, np.int64, np.complex128])
def test_out_wrong_dtype(odt):
    q, k, v = _qkv()
    out = np.full((2, 3, 6), SENTINEL).astype(odt)
    before = out.copy()
    with pytest.raises((ValueError, TypeError), match="out"):
        fastattn.attention(q, k, v, out=out)
    np.testing.assert_array_equal(out, before)


def test_out_float64_for_float32_inputs():
    q, k, v = _qkv(dtype=np.float32)
    out = _sentinel_out((2, 3, 6), np.float64)
    with pytest.raises((ValueError, TypeError), match="out"):
        fastattn.attention(q, k, v, out=out)
    assert np.all(out == SENTINEL)


def test_out_float32_for_float16_inputs():
    q, k, v = _qkv(dtype=np.float16)
    out = _sentinel_out((2, 3, 6), np.float32)
    with pytest.raises((ValueError, TypeError), match="out"):
        fastattn.attention(q, k, v, out=out)
    assert np.all(out == SENTINEL)


def test_out_read_only():
    q, k, v = _qkv()
    out = _sentinel_out((2, 3, 6))
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        fastattn.attention(q, k, v, out=out)
    assert np.all(out == SENTINEL)


def test_out_read_only_broadcast_view():
    q, k, v = _qkv()
    out = np.broadcast_to(np.full((1, 3, 6), SENTINEL), (2, 3, 6))
    with pytest.raises(ValueError, match="out"):
        fastattn.attention(q, k, v, out=out)
    assert np.all(out == SENTINEL)


def test_out_not_an_array():
    q, k, v = _qkv()
    with pytest.raises((TypeError, ValueError), match="out"):
        fastattn.attention(q, k, v, out=[[0.0] * 6] * 3)


def test_out_error_beats_other_work_with_return_weights():
    q, k, v = _qkv()
    out = _sentinel_out((2, 3, 5))
    with pytest.raises(ValueError, match="out"):
        fastattn.attention(q, k, v, out=out, return_weights=True, is_causal=True)
    assert np.all(out == SENTINEL)


# ---------------------------------------------------------------------------
# num_threads
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -1, -8])
def test_num_threads_below_one(n):
    q, k, v = _qkv()
    _raises_untouched(ValueError, ["num_threads"], [], q, k, v, out_shape=(2, 3, 6), num_threads=n)


@pytest.mark.parametrize("n", [2.0, 1.5, "2", [2], np.float64(2.0)])
def test_num_threads_not_int(n):
    q, k, v = _qkv()
    _raises_untouched(TypeError, ["num_threads"], [], q, k, v, out_shape=(2, 3, 6), num_threads=n)


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("bad", [np.complex128, np.complex64, object, "U3", "datetime64[s]"])
def test_unsupported_dtype(which, bad):
    q, k, v = _qkv()
    args = {"query": q, "key": k, "value": v}
    if bad == "U3":
        args[which] = args[which].astype(str).astype("U3")
    elif bad == "datetime64[s]":
        args[which] = np.zeros(args[which].shape, dtype=bad)
    else:
        args[which] = args[which].astype(bad)
    with pytest.raises(TypeError) as info:
        fastattn.attention(args["query"], args["key"], args["value"])
    assert which in str(info.value) or "dtype" in str(info.value), str(info.value)


def test_unsupported_dtype_leaves_out_untouched():
    q, k, v = _qkv()
    out = _sentinel_out((2, 3, 6))
    with pytest.raises(TypeError):
        fastattn.attention(q.astype(np.complex128), k, v, out=out)
    assert np.all(out == SENTINEL)


def test_complex_attn_mask():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="attn_mask"):
        fastattn.attention(q, k, v, attn_mask=np.zeros((3, 5), np.complex128))


# ---------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------

_MEMORY_SCRIPT = textwrap.dedent("""
    import numpy as np, fastattn
    L = S = 10**6
    dt = np.dtype({dtype!r})
    q = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, L, 1))
    k = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, S, 1))
    v = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, S, 1))
    try:
        fastattn.attention(q, k, v, return_weights=True)
    except MemoryError as e:
        print("MEMORYERROR", e)
    else:
        print("NO ERROR")
    # small L, huge S, with a sentinel out: still untouched
    q = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, 1000, 1))
    k = np.broadcast_to(np.ones((1, 1, 1, 1), dt), (4, 16, 10**9, 1))
    v = k
    out = np.full((4, 16, 1000, 1), -7, dt)
    try:
        fastattn.attention(q, k, v, return_weights=True, out=out)
    except MemoryError as e:
        print("MEMORYERROR2", bool(np.all(out == -7)))
    else:
        print("NO ERROR2")
""")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_weights_too_large_raises_memory_error(dtype):
    """4*16 heads x 10**6 x 10**6 weights (256-512 TB): MemoryError, quickly.

    Run in a subprocess with a timeout so that an implementation that starts
    computing before allocating cannot hang the suite.
    """
    proc = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT.format(dtype=dtype)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MEMORYERROR " in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "MEMORYERROR2 True" in proc.stdout, proc.stdout + proc.stderr[-3000:]


# ---------------------------------------------------------------------------
# ISA selection
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["avx1024", "", "AVX2x", "neon"])
def test_set_isa_unknown(name):
    before = fastattn.get_isa()
    with pytest.raises(ValueError):
        fastattn.set_isa(name)
    assert fastattn.get_isa() == before


def test_set_isa_unsupported_on_this_cpu():
    before = fastattn.get_isa()
    for name in ("generic", "avx2", "avx512"):
        if name not in fastattn.available_isas():
            with pytest.raises(ValueError):
                fastattn.set_isa(name)
            assert fastattn.get_isa() == before


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------

def test_softmax_mask_does_not_broadcast():
    x = np.zeros((3, 4))
    with pytest.raises(ValueError, match="mask"):
        fastattn.softmax(x, axis=1, mask=np.ones((3, 5), bool))


def test_softmax_mask_would_grow_x():
    x = np.zeros((3, 4))
    with pytest.raises(ValueError, match="mask"):
        fastattn.softmax(x, axis=1, mask=np.ones((2, 3, 4), bool))


@pytest.mark.parametrize("shape,dt", [((3, 5), np.float64), ((4, 3), np.float64), ((3, 4), np.float32),
                                      ((12,), np.float64)])
def test_softmax_out_wrong(shape, dt):
    x = np.zeros((3, 4))
    out = np.full(shape, SENTINEL, dt)
    with pytest.raises((ValueError, TypeError), match="out"):
        fastattn.softmax(x, axis=1, out=out)
    assert np.all(out == SENTINEL)


def test_softmax_out_read_only():
    x = np.zeros((3, 4))
    out = np.full((3, 4), SENTINEL)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        fastattn.softmax(x, axis=1, out=out)
    assert np.all(out == SENTINEL)


@pytest.mark.parametrize("bad", [np.complex128, object])
def test_softmax_unsupported_dtype(bad):
    with pytest.raises(TypeError):
        fastattn.softmax(np.zeros((3, 4)).astype(bad), axis=1)


@pytest.mark.parametrize("axis", [2, -3, (0, 2), (0, 0)])
def test_softmax_bad_axis(axis):
    x = np.zeros((3, 4))
    with pytest.raises((ValueError, IndexError)):
        fastattn.softmax(x, axis=axis)

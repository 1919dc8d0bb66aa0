"""The gradient of a float attn_mask (``return_mask_grad=True``): a learned
bias such as T5's relative position bias.  Against
fastattn.reference.attention_backward (float64) on every ISA path the
machine has, for every shape a mask broadcasts from, with the options that
hide positions; bitwise the same for any thread count and in both of the
backward's schemes, and leaving the other gradients' bits as they are.

Error bound: the mask's gradient is the logits' gradient ``P (dP - D + g)``,
one term of each dQ / dK sum, so test_backward.py's analysis bounds it
(``4 (n + E + Ev) u max|g|`` in float32, ``1e-12 max|g|`` in float64), with
the broadcast sum's additions on top (one per summed element, within the
same bound for these sizes); 16-bit inputs add the rounded forward output
and ``grad_out`` in ``D`` and the gradient's own rounding to the mask's
dtype (``4 u16 max|g|``, as there); on the matrix tiers the 16-bit pass takes
P from the float32 exp for the mask's gradient (its products' bfloat16 exp2 is
within 2^-13 of it), inside the same bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn import _core, reference
from backward_common import grad_bound as _bound
from half_common import HALF_IDS, HALVES

B, H, HK, L, S, E, EV = 2, 4, 2, 37, 150, 8, 6

SHAPES = {
    "full": (B, H, L, S),
    "over_batch": (1, H, L, S),
    "over_heads": (B, 1, L, S),
    "rows_and_keys": (L, S),
    "keys_only": (S,),
    "one_row_per_head": (1, H, 1, S),
}

OPTIONS = {
    "plain": {},
    "causal_lower_right": {"is_causal": "lower_right"},
    "causal_upper_left_window": {"is_causal": True, "window": (20, 0)},
    "softcap": {"softcap": 1.5},
    "padding_alibi_sinks": {"key_padding_mask": np.arange(S) % 7 == 3,
                            "alibi_slopes": np.linspace(0.01, 0.08, H),
                            "sinks": np.linspace(-1, 1, H)},
    "grouped_heads_softcap_window": {"enable_gqa": True, "softcap": 2.0, "window": (30, 10)},
}


def _problem(dtype, opts, mask_shape, seed=0, mask_dtype=None):
    rng = np.random.default_rng(seed)
    hk = HK if opts.get("enable_gqa") else H
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, hk, S, E)).astype(dtype)
    v = rng.standard_normal((B, hk, S, EV)).astype(dtype)
    mask = rng.standard_normal(mask_shape).astype(mask_dtype or dtype)
    mask[..., 5] = -np.inf  # a key the mask hides: its gradient is 0
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(out.dtype)
    return q, k, v, mask, out, lse, d_o


def _check(got, want, dtype, names):
    n = max(L, S) + E + EV
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert np.isfinite(a).all(), name
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
        assert err <= _bound(b, dtype, n), (name, err, _bound(b, dtype, n))


def _names(opts):
    extra = ("grad_sinks",) if "sinks" in opts else ()
    return ("grad_query", "grad_key", "grad_value") + extra + ("grad_attn_mask",)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_broadcast_shape_and_option_matches_reference(isa, name, shape, dtype):
    opts = OPTIONS[name]
    q, k, v, mask, out, lse, d_o = _problem(dtype, opts, SHAPES[shape])
    g = np.random.default_rng(3).standard_normal(lse.shape).astype(lse.dtype)
    got = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, grad_lse=g,
                                      return_mask_grad=True, **opts)
    want = reference.attention_backward(d_o, q, k, v, out, lse, mask, grad_lse=g,
                                        return_mask_grad=True, **opts)
    _check(got, want, dtype, _names(opts))
    assert not got[-1][..., 5].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["plain", "causal_upper_left_window", "softcap"])
def test_bitwise_for_one_two_and_three_threads_other_gradients_unchanged(isa, name, dtype):
    """Eight batch indices on 1, 2 and 3 threads: the same bits, and the
    same dQ, dK, dV bits as a call that does not ask for the mask's
    gradient."""
    opts = OPTIONS[name]
    q, k, v, mask, out, lse, d_o = _problem(dtype, opts, SHAPES["over_batch"], seed=1)
    plain = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, num_threads=1, **opts)
    first = None
    for threads in (1, 2, 3):
        got = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, num_threads=threads,
                                          return_mask_grad=True, **opts)
        first = first or got
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, first)), threads
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first[:3], plain))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, *HALVES],
                         ids=["float32", "float64", *HALF_IDS])
@pytest.mark.parametrize("name", ["plain", "causal_lower_right", "softcap"])
def test_fused_pass_and_two_passes_write_the_same_bits(isa, name, dtype):
    """One batch index alone on 1 thread (the fused pass) and on 2 (two
    passes: the dQ pass writes the mask's gradient), and the same index in
    a call of four (fused): the same bits."""
    opts = OPTIONS[name]
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 100, 8)).astype(dtype)
    k = rng.standard_normal((1, 4, 300, 8)).astype(dtype)
    v = rng.standard_normal((1, 4, 300, 8)).astype(dtype)
    mask = rng.standard_normal((1, 4, 100, 300)).astype(dtype)
    d_o = rng.standard_normal((1, 4, 100, 8)).astype(dtype)

    def mask_grad(n, threads):
        x = [a[:, :n] for a in (q, k, v, mask, d_o)]
        out, lse = fastattn.attention(*x[:4], return_lse=True, **opts)
        return fastattn.attention_backward(x[4], *x[:3], out, lse, x[3], num_threads=threads,
                                           return_mask_grad=True, **opts)[-1]

    whole, fused, passes = mask_grad(4, 1), mask_grad(1, 1), mask_grad(1, 2)
    assert whole[:, :1].tobytes() == fused.tobytes() == passes.tobytes()


@pytest.mark.parametrize("mask_dtype", ["inputs", "float32"])
@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_16_bit_inputs_within_the_bound_in_the_masks_dtype_other_gradients_unchanged(
        isa, dt, mask_dtype):
    opts = {"is_causal": "lower_right", "softcap": 2.0}
    mdt = dt if mask_dtype == "inputs" else np.float32
    q, k, v, mask, out, lse, d_o = _problem(dt, opts, SHAPES["over_heads"], mask_dtype=mdt)
    got = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                      **opts)
    want = reference.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                        **opts)
    _check(got, want, dt, _names(opts))
    assert got[-1].dtype == np.dtype(mdt)
    plain = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, **opts)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got[:3], plain))
    two = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                      num_threads=2, **opts)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, two))


def test_hidden_positions_and_rows_with_nothing_visible_give_zero_mask_gradients(isa):
    """Causal with an offset that leaves the first rows no key, a window,
    padding, a whole row of -inf, NaN in hidden keys and values: zero at
    every hidden position, never NaN."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 40, E))
    k = rng.standard_normal((1, 2, 30, E))
    v = rng.standard_normal((1, 2, 30, EV))
    pad = np.zeros(30, bool)
    pad[[4, 17]] = True
    k[..., 4, :] = np.nan
    v[..., 17, :] = np.inf
    mask = rng.standard_normal((40, 30))
    mask[25] = -np.inf
    opts = {"is_causal": "lower_right", "window": (6, 0), "key_padding_mask": pad}
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape)
    dm = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                     **opts)[-1]
    i, j = np.arange(40)[:, None], np.arange(30)[None, :]
    seen = (j <= i - 10) & (j >= i - 16) & ~pad & np.isfinite(mask)
    assert np.isfinite(dm).all()
    assert not dm[~seen].any() and dm[seen].any()
    assert not dm[:10].any() and not dm[25].any()


@pytest.mark.parametrize("mask", [None, "bool"], ids=["no_mask", "bool_mask"])
def test_asking_without_a_float_mask_is_a_value_error(mask):
    q = np.ones((3, 4))
    m = None if mask is None else np.ones((3, 3), bool)
    out, lse = fastattn.attention(q, q, q, m, return_lse=True)
    with pytest.raises(ValueError, match="return_mask_grad=True needs a floating-point "
                                         "attn_mask"):
        fastattn.attention_backward(out, q, q, q, out, lse, m, return_mask_grad=True)


def test_driver_refuses_a_mask_gradient_broadcast_over_the_batch_nothing_written():
    q, k, v, mask, out, lse, d_o = _problem(np.float64, {}, SHAPES["full"])
    grads = [np.full(x.shape, 7.0) for x in (q, k, v)]
    dm = np.full((1, H, L, S), 7.0)  # two batch indices would write each element
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention_backward(q, k, v, out, lse[..., None], d_o, *grads, batch=(B, H),
                                 scale=E ** -0.5, add_mask=mask, dmask=dm)
    assert all((x == 7.0).all() for x in grads) and (dm == 7.0).all()
    with pytest.raises(ValueError, match="dmask must have lse's dtype"):
        _core.attention_backward(q, k, v, out, lse[..., None], d_o, *grads, batch=(B, H),
                                 scale=E ** -0.5, add_mask=mask,
                                 dmask=np.zeros((B, H, L, S), np.float32))


@pytest.mark.parametrize("shape,grouped", [("over_batch", False), ("over_heads", False),
                                           ("over_batch", True), ("rows_and_keys", False),
                                           ("keys_only", True)],
                         ids=["over_batch", "over_heads", "over_batch_grouped",
                              "rows_and_keys", "keys_only_grouped"])
def test_mask_shared_over_a_batch_axis_runs_in_chunks_same_gradients(monkeypatch, shape,
                                                                      grouped):
    """With the buffer bound below the batch's mask gradients, the backward
    runs over the outermost axis the mask broadcasts along in chunks of two
    indices (the heads' axis only when not grouped), each call's mask
    gradient within the bound: the same dQ, dK, dV bits; the mask's the same
    bits where it broadcasts along that axis alone (summed in the same
    order), within rounding where along two."""
    from fastattn import backward
    b = 3
    opts = {"softcap": 2.0, "is_causal": "lower_right"}
    if grouped:
        opts["enable_gqa"] = True
    rng = np.random.default_rng(9)
    hk = HK if grouped else H
    q = rng.standard_normal((b, H, L, E))
    k, v = rng.standard_normal((b, hk, S, E)), rng.standard_normal((b, hk, S, EV))
    mask = rng.standard_normal({"over_batch": (1, H, L, S), "over_heads": (b, 1, L, S),
                                "rows_and_keys": (L, S), "keys_only": (S,)}[shape])
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape)
    whole = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                        **opts)
    axis_len = H if shape == "over_heads" else b
    one_index = b * H // axis_len * L * S * 8
    monkeypatch.setattr(backward, "MASK_GRAD_CHUNK_BYTES", 2 * one_index)
    kernel, sizes = _core.attention_backward, []

    def counted(*args, dmask=None, **kw):
        sizes.append(dmask.nbytes)
        return kernel(*args, dmask=dmask, **kw)

    monkeypatch.setattr(_core, "attention_backward", counted)
    got = fastattn.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                      **opts)
    assert sizes == [2 * one_index] * (axis_len // 2) + [one_index] * (axis_len % 2)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(got[:3], whole[:3]))
    if shape in ("over_batch", "over_heads"):
        assert got[3].tobytes() == whole[3].tobytes()
    else:
        np.testing.assert_allclose(got[3], whole[3], rtol=0, atol=1e-13 * np.abs(whole[3]).max())
    want = reference.attention_backward(d_o, q, k, v, out, lse, mask, return_mask_grad=True,
                                        **opts)
    _check(got, want, np.float64, _names(opts))

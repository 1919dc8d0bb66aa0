"""The 16-bit backward (float16, bfloat16) against the float64 reference, on
every ISA path the machine has: the float kernels on the 16-bit inputs
widened, or on the matrix tiers (bfloat16 on avx512_bf16 and amx, float16 on
amx with AMX-FP16) the five products on VDPBF16PS / tiles with P and dS
rounded to 16 bits as their operands.

Error bound, per gradient entry.  The inputs are exact in both computations
(the reference widens the same 16-bit values).  Write u for the 16-bit type's
unit roundoff (2**-8 bfloat16, 2**-11 float16), e = 2**-24, n = max(L, S) +
E + Ev and m the largest |g| of the gradient.  Everything up to P and dS is
float32 arithmetic on exact operands (S = Q.K^T and dP = dO.V^T accumulate
exact products in float32), bounded as test_backward.py derives:
``4 n e m``, plus ``3 u m`` for the roundings to 16 bits that both paths
make (the gradient's own, the forward's 16-bit ``out`` and the caller's
``grad_out`` in D = dO . O).  The matrix tiers then round P and dS once
each, to P~ = P (1 + d), |d| <= u, before the three products that take them:

    dV_j = sum_i P~_ij dO_i          error <= u sum_i P_ij |dO_i|
    dK_j = scale sum_i dS~_ij Q_i    error <= u scale sum_i |dS_ij| |Q_i|
    dQ_i = scale sum_j dS~_ij K_j    error <= u scale sum_j |dS_ij| |K_j|

to first order: the terms T = P^T |dO|, scale |dS|^T |Q|, scale |dS| |K|
(summed over what the forward broadcast, as the gradients are) times u.  For
bfloat16 P itself comes from the forward's cheaper exp2 (relative error
below w = 2**-13, where float16 keeps the float32 exp: w = 0), P (1 + w)
before its rounding and dS with it: the first-order term is (u + w) T.  The
second-order terms are u times the float32 errors of P and dS, relative
errors below 2**-10 here, so ``(1 + 2**-6) (u + w) T`` covers them.  The
bound ``4 n e m + 3 u m + (1 + 2**-6) (u + w) T`` holds for the widening path
as well (which makes no rounding of P or dS: its error stays far inside it).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from conftest import reference_attention
from fastattn import reference
from half_common import BF16, F16, HALF_IDS, HALVES

U16 = {F16: 2.0 ** -11, BF16: 2.0 ** -8}
EXP_W = {F16: 0.0, BF16: 2.0 ** -13}  # P's exp error on the matrix tiers (docstring)
U32 = 2.0 ** -24

OPTIONS = {
    "plain": {},
    "causal_upper_left": {"is_causal": True},
    "causal_lower_right": {"is_causal": "lower_right"},
    "window": {"window": (9, 4)},
    "window_causal": {"window": (20, None), "is_causal": True},
    "softcap": {"softcap": 1.5},
    "alibi": {"alibi_slopes": np.array([0.05, 0.02])},
    "sinks": {"sinks": np.array([0.3, -0.7])},
    "key_padding_mask": {"key_padding_mask": np.arange(150) % 7 == 3},
    "bool_mask": {"attn_mask": np.tri(70, 150, 40, dtype=bool)},
    "additive_mask": {"attn_mask": np.linspace(-2, 2, 70 * 150).reshape(70, 150)},
    "all": {"is_causal": "lower_right", "window": (60, None), "softcap": 2.0,
            "alibi_slopes": np.array([0.1, 0.05]), "sinks": np.array([0.1, 0.9])},
}


def _sum_to(x, shape):
    """x summed over the axes the forward broadcast to reach x.shape."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _magnitudes(d_o, q, k, v, grad_lse, opts):
    """The rounding terms T of the docstring for dQ, dK, dV, in float64, the
    inputs' NaN and Inf (hidden: their weights are 0) taken as 0."""
    f64 = [np.nan_to_num(np.asarray(x, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
           for x in (d_o, q, k, v)]
    do64, q64, k64, v64 = f64
    scale = opts.get("scale") or 1.0 / np.sqrt(q.shape[-1])
    ref_opts = {key: val for key, val in opts.items() if key != "enable_gqa"}
    gqa = opts.get("enable_gqa", False) and k.shape[-3] != q.shape[-3]
    kr, vr = k64, v64
    if gqa:
        rep = q.shape[-3] // k.shape[-3]
        kr, vr = np.repeat(k64, rep, axis=-3), np.repeat(v64, rep, axis=-3)
    o, p, _ = reference_attention(q64, kr, vr, return_weights=True, return_lse=True, **ref_opts)
    do64 = np.broadcast_to(do64, o.shape)
    g = 0.0 if grad_lse is None else np.asarray(grad_lse, np.float64)
    row = np.sum(do64 * o, -1) - g                        # D_i - g_i
    ds = np.where(p != 0, p * (do64 @ np.swapaxes(vr, -1, -2) - row[..., None]), 0.0)
    if opts.get("softcap"):
        raw = q64 @ np.swapaxes(kr, -1, -2) * scale
        ds = ds * (1.0 - np.tanh(raw / opts["softcap"]) ** 2)
    ads = np.abs(ds)
    t_q = scale * ads @ np.abs(kr)
    t_k = scale * np.swapaxes(ads, -1, -2) @ np.abs(q64)
    t_v = np.swapaxes(p, -1, -2) @ np.abs(do64)
    if gqa:
        hk = k.shape[-3]
        t_k = t_k.reshape(t_k.shape[:-3] + (hk, -1) + t_k.shape[-2:]).sum(axis=-3)
        t_v = t_v.reshape(t_v.shape[:-3] + (hk, -1) + t_v.shape[-2:]).sum(axis=-3)
    return _sum_to(t_q, q.shape), _sum_to(t_k, k.shape), _sum_to(t_v, v.shape)


def _inputs(rng, shape_q, shape_k, Ev, dt):
    q = rng.standard_normal(shape_q).astype(dt)
    k = rng.standard_normal(shape_k).astype(dt)
    v = rng.standard_normal(shape_k[:-1] + (Ev,)).astype(dt)
    return q, k, v


def _check(q, k, v, *, grad_lse=False, threads=None, seed=7, **opts):
    """The 16-bit gradients within the derived bound of the docstring."""
    rng = np.random.default_rng(seed)
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(out.dtype)
    g = rng.standard_normal(lse.shape).astype(lse.dtype) if grad_lse else None
    got = fastattn.attention_backward(d_o, q, k, v, out, lse, grad_lse=g, num_threads=threads,
                                      **opts)
    want = reference.attention_backward(d_o, q, k, v, out, lse, grad_lse=g, **opts)
    terms = _magnitudes(d_o, q, k, v, g, opts)
    u = U16[np.dtype(q.dtype)]
    n = max(q.shape[-2], k.shape[-2]) + q.shape[-1] + v.shape[-1]
    for name, a, b, t in zip(("grad_query", "grad_key", "grad_value"), got, want, terms):
        assert a.shape == b.shape and a.dtype == b.dtype == q.dtype, name
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert np.isfinite(a64).all(), name
        m = float(np.max(np.abs(b64), initial=0.0)) or 1.0
        bound = 4 * n * U32 * m + 3 * u * m + (1 + 2.0 ** -6) * (u + EXP_W[np.dtype(q.dtype)]) * t
        err = np.abs(a64 - b64)
        assert (err <= bound).all(), (name, float((err - bound).max()), np.argmax(err - bound))
    return got


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_within_the_derived_bound(isa, name, dt):
    q, k, v = _inputs(np.random.default_rng(1), (1, 2, 70, 20), (1, 2, 150, 20), 12, dt)
    _check(q, k, v, grad_lse=True, **OPTIONS[name])


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("causal", [False, True, "lower_right"],
                         ids=["noncausal", "causal_upper_left", "causal_lower_right"])
def test_head_dim_64_fused_pass_within_the_bound(isa, dt, causal):
    q, k, v = _inputs(np.random.default_rng(2), (1, 4, 150, 64), (1, 4, 260, 64), 64, dt)
    _check(q, k, v, is_causal=causal)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("L,S,E,Ev", [(1, 1, 3, 2), (1, 300, 8, 8), (300, 1, 4, 6),
                                      (129, 257, 16, 3), (64, 128, 1, 1), (65, 129, 33, 17),
                                      (40, 50, 130, 96)],
                         ids=["L1_S1", "L1", "S1", "off_blocks_E_ne_Ev", "on_blocks_E1",
                              "one_past_blocks", "E_past_four_tiles"])
def test_odd_shapes_within_the_bound(isa, dt, L, S, E, Ev):
    q, k, v = _inputs(np.random.default_rng(9), (2, L, E), (2, S, E), Ev, dt)
    _check(q, k, v, grad_lse=True, is_causal="lower_right" if L <= S else False)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_grouped_query_heads_within_the_bound(isa, dt):
    q, k, v = _inputs(np.random.default_rng(3), (2, 4, 90, 32), (2, 2, 140, 32), 16, dt)
    _check(q, k, v, enable_gqa=True, is_causal=True, grad_lse=True)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_broadcast_batch_dims_within_the_bound(isa, dt):
    q, k, v = _inputs(np.random.default_rng(4), (3, 1, 40, 16), (1, 2, 100, 16), 8, dt)
    _check(q, k, v, is_causal="lower_right", softcap=3.0)


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("heads", [1, 4], ids=["two_passes", "fused"])
def test_bitwise_identical_for_one_two_and_three_threads(isa, dt, heads):
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, (1, heads, 200, 64), (1, heads, 300, 64), 48, dt)
    opts = {"is_causal": "lower_right", "softcap": 4.0, "sinks": np.full(heads, 0.3)}
    out, lse = fastattn.attention(q, k, v, return_lse=True, **opts)
    d_o = rng.standard_normal(out.shape).astype(dt)
    runs = [fastattn.attention_backward(d_o, q, k, v, out, lse, num_threads=t, **opts)
            for t in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_rows_with_nothing_visible_give_zero_gradients_nan_grad_out_included(isa, dt):
    q, k, v = _inputs(np.random.default_rng(6), (2, 70, 16), (2, 140, 16), 16, dt)
    mask = np.ones((2, 70, 140), bool)
    mask[:, [3, 66]] = False                             # rows 3, 66 see nothing
    mask[1] = False                                      # batch 1 sees nothing at all
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True)
    d_o = np.random.default_rng(7).standard_normal(out.shape).astype(dt)
    d_o[:, [3, 66]] = np.nan
    dq, dk, dv = fastattn.attention_backward(d_o, q, k, v, out, lse, mask)
    for g in (dq, dk, dv):
        assert np.isfinite(g.astype(np.float64)).all()
    assert not dq[:, [3, 66]].any() and not dq[1].any() and not dk[1].any() and not dv[1].any()
    want = _check(q, k, v, attn_mask=mask)
    assert not want[0][:, [3, 66]].any()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_nan_grad_out_and_inf_query_on_hidden_rows_of_whole_blocks(isa, dt):
    """Rows that see nothing hold NaN in dO and Inf in Q, in blocks whole
    enough (rows a multiple of 16, E of 32) that Q and dO are transposed
    by the vector kernels: their gradients are zero, every other row's
    within the bound of the same call without them."""
    q, k, v = _inputs(np.random.default_rng(11), (1, 2, 256, 64), (1, 2, 256, 64), 64, dt)
    mask = np.ones((256, 256), bool)
    mask[[17, 200]] = False
    out, lse = fastattn.attention(q, k, v, mask, return_lse=True)
    d_o = np.random.default_rng(12).standard_normal(out.shape).astype(dt)
    clean = fastattn.attention_backward(d_o, q, k, v, out, lse, mask)
    q2, d_o2 = q.copy(), d_o.copy()
    q2[..., 17, 5], q2[..., 200, :] = np.inf, -np.inf
    d_o2[..., [17, 200], :] = np.nan
    out2, lse2 = fastattn.attention(q2, k, v, mask, return_lse=True)
    got = fastattn.attention_backward(d_o2, q2, k, v, out2, lse2, mask)
    for g, c in zip(got, clean):
        g64, c64 = g.astype(np.float64), c.astype(np.float64)
        assert np.isfinite(g64).all()
        assert np.allclose(g64, c64, rtol=0, atol=8 * U16[np.dtype(dt)] * np.abs(c64).max())
    assert not got[0][..., [17, 200], :].any()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_nan_and_inf_in_hidden_positions_never_reach_a_gradient(isa, dt):
    q, k, v = _inputs(np.random.default_rng(8), (1, 2, 40, 16), (1, 2, 160, 16), 16, dt)
    pad = np.zeros(160, bool)
    pad[[5, 20, 21, 130]] = True                         # seen by later rows but for the pad
    k[..., 5, :], k[..., 130, 3] = np.nan, -np.inf
    v[..., 20, :], v[..., 21, 0] = np.inf, -np.inf
    k[..., 150:, :] = np.inf                             # the future of every row (causal)
    v[..., 155, :] = np.nan
    got = _check(q, k, v, key_padding_mask=pad, is_causal=True, grad_lse=True)
    hidden = [5, 20, 21, 130, 150, 155]
    assert not got[1][..., hidden, :].any() and not got[2][..., hidden, :].any()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
def test_gradient_rounding_nearest_even_with_ties_overflow_subnormals_and_nan(isa, dt):
    """The one rounding a 16-bit gradient ends with (the kernels' vector
    rounding) gives the bits of NumPy's / ml_dtypes' cast, NaN staying NaN."""
    from fastattn import _core
    rng = np.random.default_rng(7)
    wide = (rng.standard_normal(999) * 10.0 ** rng.integers(-9, 9, 999)).astype(np.float32)
    one = np.float32(1.0).view(np.uint32)
    ties = (one + np.array([0x8000, 0x18000, 0x1000, 0x3000], np.uint32)).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 65519.0,
                        65520.0, 1e-45, 6e-8, 3e-8, 2.9e-8, 1e-40], np.float32)
    x = np.concatenate([wide, ties, -ties, special])
    got = np.empty(x.shape, dt)
    _core.round_half(x, got)
    with np.errstate(over="ignore"):  # the overflow to infinity is one of the cases
        want = x.astype(dt)
    nan = np.isnan(want.astype(np.float32))
    assert (np.isnan(got.astype(np.float32)) == nan).all()
    assert (got.view(np.uint16)[~nan] == want.view(np.uint16)[~nan]).all()


@pytest.mark.parametrize("dt", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("heads,L,S,E,Ev", [(1, 100, 300, 40, 24), (4, 70, 260, 64, 72)],
                         ids=["two_passes_odd_dims", "fused_odd_dims"])
def test_gradients_rounded_by_the_kernel_equal_its_float32_ones_rounded_once(isa, dt, heads,
                                                                              L, S, E, Ev):
    """Where the kernel writes 16-bit gradients itself, their bits are those
    of its float32 gradients rounded once (round_half); elsewhere it refuses
    16-bit gradients (nothing written)."""
    from fastattn import _core
    rng = np.random.default_rng(9)
    q, k, v = _inputs(rng, (1, heads, L, E), (1, heads, S, E), Ev, dt)
    out, lse = fastattn.attention(q, k, v, is_causal="lower_right", return_lse=True)
    d_o = rng.standard_normal(out.shape).astype(dt)
    kw = {"batch": (1, heads), "scale": E ** -0.5, "causal": True, "causal_offset": S - L}

    def run(gdt):
        grads = [np.zeros(x.shape, gdt) for x in (q, k, v)]
        _core.attention_backward(q, k, v, out, lse[..., None], d_o, *grads, **kw)
        return grads

    wide = run(np.float32)
    if not _core.backward_rounds(q):
        with pytest.raises(ValueError, match="rejected"):
            run(dt)
        return
    for got, g32 in zip(run(dt), wide):
        want = np.empty(g32.shape, dt)
        _core.round_half(g32, want)
        assert got.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()

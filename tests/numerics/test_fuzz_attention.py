"""Fuzz suite: fastattn.attention against fastattn.reference.

Property tests (hypothesis, the conftest's fixed derandomized ``fastattn``
profile, so every failure reproduces) over random shapes (1 and odd sizes,
``L != S``, grouped-query heads), dtypes, strides (Fortran order, transposes,
step-2 slices, negative strides on the row axis, the feature axis or every
axis), every mask kind and their combinations, scales, magnitudes up to 1e4
and NaN/Inf entries, for the path that returns the weights and the streaming
path that never materialises them, on every ISA path (the ``isa`` fixture).

The truth is :func:`fastattn.reference.attention` evaluated on float64 copies
of the inputs.  A fixed ``rtol`` is wrong here: with entries of 1e4, float32
rounding of the scores legitimately moves the weights by orders of magnitude
more than with entries of 1.  Every comparison therefore uses a forward-error
bound computed from the inputs, derived below.

Error bound (``u``: unit roundoff; we use ``eps = 2u`` of the compute dtype
``c`` for margin, plus the same terms with float64's ``eps`` for the
reference's own rounding)
------------------------------------------------------------------------------

*Scores.*  ``s_ij = scale * q_i . k_j + m_ij`` (``m``: additive mask).  A dot
product of length ``E`` in any summation order (FMA or not, blocked or not,
``q`` pre-multiplied by ``scale`` or not) errs by at most ``γ_E |scale| A_ij``
with ``A_ij = Σ_d |q_id| |k_jd|`` and ``γ_E = E u / (1 - E u)``; multiplying
by ``scale``, converting the mask to the compute dtype and adding it cost
``u`` each of ``|s_ij|`` and ``|m_ij|``; subtracting the running row maximum
(and the rescaling by ``exp(m_old - m_new)`` of the online softmax) costs
``u |s_ij - max|``.  So, with margin,

    Δ_ij = (eps_c + eps_64) * ((E + 4) |scale| A_ij + 2 |m_ij| + |s_ij| + 2 max_k |s_ik|)

bounds the error of every score *as it enters exp*.

*Weights.*  The softmax is monotone: ``w_j`` increases with ``s_j`` and
decreases with every other score.  So if each score lies in
``[s_j - Δ_j, s_j + Δ_j]`` the exact softmax of the perturbed scores lies in

    w_j^hi = exp(s_j + Δ_j) / (exp(s_j + Δ_j) + Σ_{k≠j} exp(s_k - Δ_k))
    w_j^lo = exp(s_j - Δ_j) / (exp(s_j - Δ_j) + Σ_{k≠j} exp(s_k + Δ_k))

(the sums over visible keys only; computed in log space with prefix/suffix
sums so nothing cancels).  For small Δ this is ``w_j (1 ± 2 max Δ)``, the
classical bound, but it stays sharp in the one-hot regime of huge scores where
``exp(2 max Δ)`` is meaningless.  Evaluating exp (about 2 ulp), the row sum
(``n`` visible terms, plus one rescale per key block and one per key split)
and the division add a relative ``ρ = (n + S/64 + 16) eps_c`` and, for float16
results, the final rounding ``eps_16``; exp flushes results below the smallest
normal number to 0, and float16 weights round to multiples of ``2^-24``, hence
an absolute floor ``τ_w = 4 tiny_c (+ 2^-24)``.  Checked: every returned weight
lies in ``[w^lo (1 - ρ) - τ_w, w^hi (1 + ρ) + τ_w]`` and differs from the
reference's by at most the width of that interval; each visible row sums to
1 within ``2ρ + n (eps_out + τ_w)``.

*Output.*  ``o_ic = Σ_j w_j v_jc``.  The kernel's and the reference's weights
both lie in ``[w^lo_j, w^hi_j]`` (widened as above), so they differ by at most
``δ_j = w^hi_j - w^lo_j`` -- computed from the inputs alone, never from the
reference's answer.  With the accumulation of ``n`` products in any order,

    |ô_ic - o_ic| <= Σ_j δ_j |v_jc| + (n + S/64 + 16) eps_c Σ_j w^hi_j |v_jc|
                     + eps_out |o_ic| + τ_o,

``τ_o = 4 tiny_c Σ_j |v_jc|`` (flushed weights) plus half the smallest float16
subnormal for float16 results.  The weights path and the streaming path each
satisfy it, so they differ by at most twice that.

Tightness: with O(1) entries the bound is ~1e-5 relative in float32 and
~1e-13 in float64, so a wrong mask, a dropped key (block), a swapped causal
alignment or a lost key split makes some example fail.  This was checked by
mutating the reference call in a scratch copy of this file: swapping
``'upper_left'``/``'lower_right'``, dropping the last key, ignoring
``key_padding_mask``, dropping keys 128..255 (one key block) and scaling
``scale`` by 1.001 each make every attention test that can see the mutation
fail -- through the weights check and, with it disabled, through the output
bound alone.

Non-finite entries (what is compared, and the rule for the ambiguous cases)
-----------------------------------------------------------------------------

* A position hidden by a mask (or with score ``-inf``) never touches the
  result: entries of K and V seen only by hidden positions are set to
  NaN/±Inf and the result must be *bitwise* equal to the result with those
  entries replaced by 0 (and match the reference).
* A visible NaN or ``+inf`` score makes the row's visible weights and its whole
  output row NaN -- compared exactly, as classified from float64 scores (with
  entries <= 1e4 no score overflows in float32, so the class is the same).
* An Inf/NaN in a *visible* value ``v_jc`` makes output ``(i, c)`` NaN or
  ±Inf as in the reference -- but only when that is unambiguous: every visible
  key ``j`` with a non-finite ``v_jc`` must have ``w^lo_j (1 - ρ) > τ_w``, so
  its weight is certainly nonzero in both.  Otherwise one side may have a
  weight of exactly 0 (flushed) where the other has a denormal one, and
  ``0 * inf`` is skipped by the kernels but NaN in the reference; such
  entries are not compared.

Invariants beyond the reference: hidden weights exactly 0, rows with nothing
visible exactly 0 (weights and output), visible rows sum to 1, one thread and
two threads bitwise equal (a NaN equals any NaN), the weights path's output equals the streaming
path's within the bound, ``out=`` is filled and returned.

fastattn.softmax is fuzzed in test_fuzz_softmax.py with the same interval
argument; the shared pieces (layouts, values, the interval) are in
fuzz_common.py.
"""


from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from conftest import CAUSAL, _sub_batch, empty_with_layout, examples, hidden_positions
from fuzz_common import EPS64, F16, F32, F64, LAYOUTS, SPECIALS, _eps, _values, layout, softmax_interval


# ---------------------------------------------------------------------------
# attention cases
# ---------------------------------------------------------------------------

def _fully_hidden(H, batch, lead, gqa, own_lead):
    """For each row of K/V (shape own_lead + (Hkv,) + (S,)): hidden for every row using it."""
    h = H.all(axis=-2)  # batch + (S,)
    if gqa is not None:
        hkv, g = gqa
        h = h.reshape(lead + (hkv, g, h.shape[-1])).all(axis=-2)
        tail = (hkv,)
    else:
        tail = ()
    nb = len(lead)
    extra = nb - len(own_lead)
    h = h.all(axis=tuple(range(extra))) if extra else h
    for ax, n in enumerate(own_lead):
        if n == 1 and h.shape[ax] != 1:
            h = h.all(axis=ax, keepdims=True)
    assert h.shape == own_lead + tail + (H.shape[-1],), (h.shape, own_lead, tail)
    return h


def _sizes(draw, size):
    """(lead, L, S, hq_max, E, Ev) of a fuzz case of that size."""
    if size == "small":
        lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        L = draw(st.integers(1, 12))
        S = draw(st.integers(1, 12))
        hq_max = 8
        E = draw(st.one_of(st.integers(1, 9), st.integers(1, 80)))
        Ev = draw(st.one_of(st.just(E), st.integers(1, 9), st.integers(1, 80)))
    elif size == "tiles":  # crossing the 64/66-row tiles and the 128-key blocks
        lead = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
        L = draw(st.one_of(st.sampled_from([1, 7, 8, 9, 63, 64, 65, 66, 67, 131, 200]),
                           st.integers(1, 200)))
        S = draw(st.one_of(st.sampled_from([1, 127, 128, 129, 200]), st.integers(1, 200)))
        hq_max = 2
        E = draw(st.integers(1, 40))
        Ev = draw(st.integers(1, 40))
    else:  # "split": few query rows, many keys -> the key-split path (and direct decode)
        lead = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
        L = draw(st.one_of(st.integers(1, 8), st.integers(1, 70)))
        S = draw(st.integers(1025, 1700))
        hq_max = 2
        E = draw(st.integers(1, 24))
        Ev = draw(st.integers(1, 24))
    return lead, L, S, hq_max, E, Ev


def _attn_mask(draw, rng, batch, L, S, dtype):
    """(attn_mask, its dtype): none, bool or additive, of a broadcastable shape,
    some rows all hidden."""
    mask_kind = draw(st.sampled_from([None, "bool", "bool", "float", "float"]))
    mask = None
    mask_dtype = None
    if mask_kind is not None:
        full = batch + (L, S)
        mdims = [n if draw(st.booleans()) else 1 for n in full]
        mdims[-1] = S if draw(st.integers(0, 4)) else 1
        mshape = tuple(mdims[draw(st.integers(0, len(mdims) - 1)):])
        if mask_kind == "bool":
            p = draw(st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]))
            mask = rng.random(mshape) < p
        else:
            mask = rng.standard_normal(mshape) * draw(st.sampled_from([0.5, 3.0, 1e4]))
            pinf = draw(st.sampled_from([0.0, 0.3, 0.9, 1.0]))
            mask[rng.random(mshape) < pinf] = -np.inf
            mask_dtype = draw(st.sampled_from([dtype, F64]))
        if len(mshape) >= 2 and mshape[-2] > 1 and draw(st.booleans()):
            # some all-hidden rows
            rows = rng.random(mshape[-2]) < 0.3
            mask[..., rows, :] = False if mask_kind == "bool" else -np.inf
        if mask_kind == "float" and mask_dtype == F16:
            mask = mask.astype(F16).astype(np.float64)
    return mask, mask_dtype


def _key_padding(draw, rng, kpm_kind, qlead, head_q, S):
    """key_padding_mask: none, (S,) or (N, S)."""
    kpm = None
    if kpm_kind == "1d":
        kpm = rng.random(S) < draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    elif kpm_kind == "2d":
        n0 = (qlead + head_q)[0]
        kpm = rng.random((draw(st.sampled_from([n0, 1])), S)) < draw(
            st.sampled_from([0.0, 0.3, 0.8]))
    return kpm


@st.composite
def attention_cases(draw, size="small"):
    dtype = draw(st.sampled_from([F32, F32, F32, F64, F64, F64, F16]))
    gqa_on = draw(st.booleans())
    lead, L, S, hq_max, E, Ev = _sizes(draw, size)
    if gqa_on:
        hq = draw(st.integers(1, hq_max))
        hkv = draw(st.sampled_from([d for d in range(1, hq + 1) if hq % d == 0]))
        gqa = (hkv, hq // hkv)
    else:
        hq = hkv = None
        gqa = None

    kpm_kind = draw(st.sampled_from([None, None, "1d", "2d"]))
    head_q = (hq,) if gqa_on else ()
    if kpm_kind == "2d" and not (lead + head_q):
        kpm_kind = "1d"
    # key_padding_mask (N, S): N = query.shape[0]; the query carries every
    # leading dim then (see the report on the reference for the other case).
    qlead = lead if kpm_kind == "2d" else _sub_batch(draw, lead)
    klead, vlead = _sub_batch(draw, lead), _sub_batch(draw, lead)
    lead = np.broadcast_shapes(qlead, klead, vlead)
    batch = lead + head_q
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = _values(draw, rng, qlead + head_q + (L, E), dtype)
    k = _values(draw, rng, klead + ((hkv,) if gqa_on else ()) + (S, E), dtype)
    v = _values(draw, rng, vlead + ((hkv,) if gqa_on else ()) + (S, Ev), dtype)

    mask, mask_dtype = _attn_mask(draw, rng, batch, L, S, dtype)
    kpm = _key_padding(draw, rng, kpm_kind, qlead, head_q, S)
    is_causal = draw(st.sampled_from(CAUSAL))
    scale = draw(st.sampled_from([None, None, None, 0.0, -0.5, -1.0, 1e-3, 1e-6,
                                  0.125, 2.0, 10.0, 1e3]))

    # non-finite entries: in hidden K/V rows (must have no influence) and visible ones
    poison_hidden = draw(st.sampled_from([False, False, True]))
    visible_bad = draw(st.sampled_from([0.0, 0.0, 0.0, 0.0, 0.01, 0.05]))
    nan_mask = mask is not None and mask.dtype.kind == "f" and draw(st.integers(0, 9)) == 0
    return dict(dtype=dtype, q=q, k=k, v=v, mask=mask, mask_dtype=mask_dtype, kpm=kpm,
                is_causal=is_causal, scale=scale, gqa=gqa, lead=lead, batch=batch,
                qlead=qlead, klead=klead, vlead=vlead,
                poison_hidden=poison_hidden, visible_bad=visible_bad, nan_mask=nan_mask,
                bad_seed=draw(st.integers(0, 2**32 - 1)),
                layouts=tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(4)),
                out_layout=draw(st.sampled_from([None, None, "C", "sliced", "negative", "F"])),
                threads=draw(st.sampled_from([1, 2])),
                return_weights=draw(st.booleans()))


def _prepare(case):
    """Apply the non-finite entries; return (q, k, v, mask) in float64 and the
    set of poisoned hidden entries (for the no-influence check)."""
    rng = np.random.default_rng(case["bad_seed"])
    q, k, v, mask = case["q"].copy(), case["k"].copy(), case["v"].copy(), case["mask"]
    L, S = q.shape[-2], k.shape[-2]
    H = hidden_positions(L, S, case["batch"], is_causal=case["is_causal"], attn_mask=mask,
                         key_padding_mask=case["kpm"])
    poison = None
    if case["poison_hidden"]:
        hk = _fully_hidden(H, case["batch"], case["lead"], case["gqa"], case["klead"])
        hv = _fully_hidden(H, case["batch"], case["lead"], case["gqa"], case["vlead"])
        pk = hk[..., None] & (rng.random(k.shape) < 0.5)
        pv = hv[..., None] & (rng.random(v.shape) < 0.5)
        if pk.any() or pv.any():
            poison = (pk, pv)
            k[pk] = SPECIALS[rng.integers(0, 3, int(pk.sum()))]
            v[pv] = SPECIALS[rng.integers(0, 3, int(pv.sum()))]
    p = case["visible_bad"]
    if p:
        for a in (q, k, v):
            pick = rng.random(a.shape) < p
            a[pick] = SPECIALS[rng.integers(0, 3, int(pick.sum()))]
    if case["nan_mask"]:
        mask = mask.copy()
        pick = (rng.random(mask.shape) < 0.05) & np.isfinite(mask)  # hidden stays hidden
        mask[pick] = np.where(rng.random(int(pick.sum())) < 0.5, np.nan, np.inf)
    return q, k, v, mask, poison


def _call(q, k, v, mask, case, *, return_weights, threads, out=None):
    return fastattn.attention(q, k, v, mask, is_causal=case["is_causal"], scale=case["scale"],
                              enable_gqa=case["gqa"] is not None,
                              key_padding_mask=case["kpm"], return_weights=return_weights,
                              num_threads=threads, out=out)


def _same_bits(a, b):
    """Bitwise equal, except that any NaN equals any NaN (payload and sign not compared)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    ui = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(na, nb) and np.array_equal(a.view(ui)[~na], b.view(ui)[~nb]))


def _expected(q64, k64, v64, m64, case, cdt, odt):
    """Reference (float64) plus everything the bound needs."""
    L, E = q64.shape[-2:]
    S, Ev = v64.shape[-2:]
    batch = case["batch"]
    ref_o, ref_w = reference.attention(q64, k64, v64, m64, case["is_causal"], case["scale"],
                                       case["gqa"] is not None, key_padding_mask=case["kpm"],
                                       return_weights=True)
    kk, vv = k64, v64
    if case["gqa"] is not None:
        g = case["gqa"][1]
        kk, vv = np.repeat(k64, g, axis=-3), np.repeat(v64, g, axis=-3)
    scale = case["scale"]
    sc = (1.0 / math.sqrt(E)) if scale is None else float(scale)
    with np.errstate(all="ignore"):
        s = np.matmul(q64, np.swapaxes(kk, -1, -2)) * sc
        A = np.matmul(np.abs(q64), np.swapaxes(np.abs(kk), -1, -2))
        am = np.zeros((1, 1))
        if m64 is not None and m64.dtype != bool:
            s = s + m64
            am = np.abs(m64)
        s = np.broadcast_to(s, batch + (L, S))
        A = np.broadcast_to(A, batch + (L, S))
        hidden = hidden_positions(L, S, batch, is_causal=case["is_causal"], attn_mask=m64,
                                  key_padding_mask=case["kpm"])
        hidden = hidden | (s == -np.inf)
        vis = ~hidden
        nvis = vis.sum(axis=-1)
        dead = nvis == 0
        bad_row = np.any(vis & ~np.isfinite(s), axis=-1)  # NaN or +inf visible score
        ok = ~dead & ~bad_row
        okv = vis & ok[..., None]
        s0 = np.where(okv, s, 0.0)
        smax = np.max(np.abs(s0), axis=-1, keepdims=True)
        eps_c = _eps(cdt)
        e2 = eps_c + EPS64
        delta = e2 * ((E + 4) * abs(sc) * np.where(okv, A, 0.0) + 2 * am + np.abs(s0) + 2 * smax)
        w_lo, w_hi = softmax_interval(s0, delta, okv)
        eps_out = _eps(odt) if odt == F16 else 0.0
        rho = ((nvis + S / 64 + 16) * eps_c + (nvis + 16) * EPS64 + eps_out)[..., None]
        tau_w = 4 * float(np.finfo(cdt).tiny) + (2.0 ** -24 if odt == F16 else 0.0)
        w_hi = np.minimum(w_hi * (1 + rho), 1.0) + tau_w
        w_lo = np.maximum(w_lo * (1 - rho) - tau_w, 0.0)
        w_lo, w_hi = np.where(okv, w_lo, 0.0), np.where(okv, w_hi, 0.0)
        vb = np.broadcast_to(vv, batch + (S, Ev))
        vabs = np.where(np.isfinite(vb), np.abs(vb), 0.0)
        dev = w_hi - w_lo  # both the kernel's and the reference's weights lie in [w_lo, w_hi]
        gam = ((nvis + S / 64 + 16) * (eps_c + EPS64))[..., None]
        o_bound = (np.matmul(dev, vabs) + gam * np.matmul(w_hi, vabs)
                   + eps_out * np.abs(np.nan_to_num(ref_o)) + 4 * float(np.finfo(cdt).tiny)
                   * vabs.sum(axis=-2, keepdims=True)
                   + (2.0 ** -25 if odt == F16 else 0.0))
        # output entries fed by a visible non-finite value
        vbad = ~np.isfinite(vb)                                # batch + (S, Ev)
        touched = np.matmul(okv.astype(np.float64), vbad.astype(np.float64)) > 0
        sure = okv & (w_lo > tau_w)                            # certainly nonzero weight
        unsure = okv & ~sure
        ambiguous = np.matmul(unsure.astype(np.float64), vbad.astype(np.float64)) > 0
    return dict(o=ref_o, w=ref_w, hidden=hidden, vis=vis, dead=dead, bad_row=bad_row, ok=ok,
                okv=okv, w_lo=w_lo, w_hi=w_hi, o_bound=o_bound, touched=touched,
                ambiguous=ambiguous, rho=rho, tau_w=tau_w, nvis=nvis, eps_out=eps_out)


def _check_weights(w, ex, what):
    w = np.asarray(w, dtype=np.float64)
    assert w.shape == ex["w"].shape, (what, w.shape, ex["w"].shape)
    assert np.all(w[ex["hidden"]] == 0), f"{what}: a hidden position got a nonzero weight"
    assert np.all(w[ex["dead"]] == 0), f"{what}: a row with nothing visible got weights"
    bad = ex["bad_row"][..., None] & ex["vis"]
    assert np.all(np.isnan(w[bad])), f"{what}: a row with a visible NaN/+inf score is not NaN"
    okv = ex["okv"]
    # both lie in [w_lo, w_hi]: the kernel's weight and the reference's differ by at most its width
    inside = (w >= ex["w_lo"]) & (w <= ex["w_hi"]) & (
        np.abs(w - ex["w"]) <= ex["w_hi"] - ex["w_lo"])
    if not np.all(inside[okv]):
        idx = np.argwhere(okv & ~inside)[0]
        t = tuple(idx)
        raise AssertionError(
            f"{what}: weight {w[t]!r} at {t} outside [{ex['w_lo'][t]!r}, {ex['w_hi'][t]!r}] "
            f"or too far from the reference {ex['w'][t]!r}; "
            f"{int((okv & ~inside).sum())} of {int(okv.sum())}")
    rows = ex["ok"]
    tot = np.sum(np.where(okv, w, 0.0), axis=-1)
    tol = 2 * ex["rho"][..., 0] + ex["nvis"] * (ex["eps_out"] + ex["tau_w"])
    assert np.all(np.abs(tot - 1)[rows] <= tol[rows]), f"{what}: a visible row does not sum to 1"


def _check_output(o, ex, what, factor=1.0):
    o = np.asarray(o, dtype=np.float64)
    ref = ex["o"]
    assert o.shape == ref.shape, (what, o.shape, ref.shape)
    Ev = o.shape[-1]
    dead = np.broadcast_to(ex["dead"][..., None], o.shape)
    assert np.all(o[dead] == 0), f"{what}: a row with nothing visible is not exactly 0"
    badr = np.broadcast_to(ex["bad_row"][..., None], o.shape)
    assert np.all(np.isnan(o[badr])), f"{what}: a row with a visible NaN/+inf score is not NaN"
    ok = np.broadcast_to(ex["ok"][..., None], o.shape)
    if Ev == 0:
        return
    finite = ok & ~ex["touched"]
    with np.errstate(invalid="ignore"):     # inf - inf in the rows checked below
        err = np.abs(o - ref)
    good = err <= factor * ex["o_bound"]
    if not np.all(good[finite]):
        t = tuple(np.argwhere(finite & ~good)[0])
        raise AssertionError(f"{what}: output {o[t]!r} at {t}, reference {ref[t]!r}, "
                             f"bound {factor * ex['o_bound'][t]!r}; "
                             f"{int((finite & ~good).sum())} of {int(finite.sum())} entries")
    sure = ok & ex["touched"] & ~ex["ambiguous"]
    same = (np.isnan(o) == np.isnan(ref)) & (np.isposinf(o) == np.isposinf(ref)) & (
        np.isneginf(o) == np.isneginf(ref))
    if not np.all(same[sure]):
        t = tuple(np.argwhere(sure & ~same)[0])
        raise AssertionError(f"{what}: non-finite value: output {o[t]!r} at {t}, "
                             f"reference {ref[t]!r}")


def run_attention_case(case):
    dtype = case["dtype"]
    cdt = F32 if dtype == F16 else dtype
    q64, k64, v64, m64, poison = _prepare(case)
    mask_in = m64
    if m64 is not None and m64.dtype != bool:
        mask_in = m64.astype(case["mask_dtype"])
    lay = case["layouts"]
    q = layout(q64.astype(dtype), lay[0])
    k = layout(k64.astype(dtype), lay[1])
    v = layout(v64.astype(dtype), lay[2])
    mk = None if mask_in is None else layout(mask_in, lay[3])
    # a float mask is used in the inputs' dtype (a float64 one with float16
    # inputs is rounded to float16): the reference adds what the kernel adds
    m64 = None if mk is None else (mk if mk.dtype == bool else
                                   mk.astype(dtype).astype(np.float64))
    odt = dtype
    ex = _expected(q64, k64, v64, m64, case, cdt, odt)
    shape = ex["o"].shape

    # 1. the weights path, one thread
    o_w, w = _call(q, k, v, mk, case, return_weights=True, threads=1)
    assert o_w.dtype == odt and w.dtype == odt
    _check_weights(w, ex, "weights")
    _check_output(o_w, ex, "output (weights path)")
    # 2. the streaming path, two threads, into out= (any layout) when drawn
    out = None
    if case["out_layout"] is not None:
        out, _ = empty_with_layout(shape, odt, case["out_layout"], -7.0)
    o_s = _call(q, k, v, mk, case, return_weights=False, threads=2, out=out)
    if out is not None:
        assert o_s is out
    assert o_s.dtype == odt and o_s.shape == shape
    _check_output(o_s, ex, "output (streaming path)")
    # the two paths agree within twice the bound (each is within the bound of the truth)
    both = np.broadcast_to(ex["ok"][..., None], shape) & ~ex["touched"]
    with np.errstate(invalid="ignore"):     # inf - inf outside `both`
        d = np.abs(o_w.astype(np.float64) - o_s.astype(np.float64))
    assert np.all(d[both] <= 2 * ex["o_bound"][both]), "weights path and streaming path differ"
    # 3. the drawn path with the other thread count: bitwise the same
    rw, nt = case["return_weights"], case["threads"]
    again = _call(q, k, v, mk, case, return_weights=rw, threads=3 - nt)
    first = (o_w, w) if (rw and nt == 1) else (o_s if (not rw and nt == 2) else None)
    if first is None:
        first = _call(q, k, v, mk, case, return_weights=rw, threads=nt)
    if rw:
        assert _same_bits(first[0], again[0]) and _same_bits(first[1], again[1]), \
            "1 and 2 threads differ (weights path)"
    else:
        assert _same_bits(first, again), "1 and 2 threads differ (streaming path)"
    # 4. entries seen only by hidden positions have no influence at all
    if poison is not None:
        pk, pv = poison
        kz, vz = k64.copy(), v64.copy()
        kz[pk] = 0.0
        vz[pv] = 0.0
        kz, vz = layout(kz.astype(dtype), lay[1]), layout(vz.astype(dtype), lay[2])
        for rw2 in (True, False):
            a = _call(q, k, v, mk, case, return_weights=rw2, threads=1)
            b = _call(q, kz, vz, mk, case, return_weights=rw2, threads=1)
            if rw2:
                assert _same_bits(a[0], b[0]) and _same_bits(a[1], b[1]), \
                    "NaN/Inf in hidden K/V changed the result (weights path)"
            else:
                assert _same_bits(a, b), "NaN/Inf in hidden K/V changed the result (streaming)"


@settings(max_examples=examples(200))
@given(case=attention_cases())
def test_fuzz_attention_vs_reference(isa, case):
    """Small shapes (1..12 rows, 1..80 features, up to 2 leading dims, GQA heads)."""
    run_attention_case(case)


@settings(max_examples=examples(50))
@given(case=attention_cases(size="tiles"))
def test_fuzz_attention_vs_reference_tiles(isa, case):
    """Up to 200 rows and keys: crossing the 64/66-row tiles and 128-key blocks."""
    run_attention_case(case)


@settings(max_examples=examples(40))
@given(case=attention_cases(size="split"))
def test_fuzz_attention_vs_reference_key_split(isa, case):
    """Few query rows and more than 1024 keys: the decode and key-split paths."""
    run_attention_case(case)

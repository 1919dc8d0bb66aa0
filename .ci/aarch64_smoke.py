"""The aarch64 smoke test (.ci/aarch64.sh, .ci/build_wheel_aarch64.sh), run
under qemu-aarch64: every dtype and the main features (masks, window, soft
cap, GQA, decoding, the backward pass, the int8 cache, paged caches) against
fastattn.reference, on each path named in argv (default: every path this CPU
offers), each forced in turn; the references are computed once.  With
FASTATTN_ISA set, the path in use at import must be that one."""
import os
import sys

import ml_dtypes
import numpy as np

import fastattn
from fastattn import reference

if os.environ.get("FASTATTN_ISA"):
    assert fastattn.get_isa() == os.environ["FASTATTN_ISA"], fastattn.get_isa()
ISAS = sys.argv[1:] or list(fastattn.available_isas())
print("fastattn", fastattn.__version__, "default", fastattn.get_isa(), "of",
      fastattn.available_isas(), "checking", ISAS)
rng = np.random.default_rng(7)
TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}


def forward_cases():
    """(what, call, reference result, tolerance) of attention()"""
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        name = np.dtype(dt).name
        for L, S, hq, hk in ((1, 700, 4, 2), (5, 37, 2, 2), (70, 130, 4, 1), (129, 129, 2, 2)):
            q = rng.standard_normal((2, hq, L, 40)).astype(dt)
            k = rng.standard_normal((2, hk, S, 40)).astype(dt)
            v = rng.standard_normal((2, hk, S, 24)).astype(dt)
            mask = rng.random((L, S)) < 0.8
            f64 = [x.astype(np.float64) for x in (q, k, v)]
            for kw in ({}, {"is_causal": "lower_right"}, {"attn_mask": mask}, {"window": (16, 0)},
                       {"softcap": 5.0}):
                kw = dict(kw, enable_gqa=hq != hk)
                want = reference.attention(*f64, **kw)
                yield ((name, L, S, hq, hk, sorted(kw)),
                       lambda q=q, k=k, v=v, kw=kw: [fastattn.attention(q, k, v, **kw)],
                       [want], TOL[name], np.dtype(dt))


def backward_cases():
    for dt, btol in ((np.float32, 1e-4), (np.float64, 1e-10)):
        q, k, v, g = (rng.standard_normal((2, 3, 45, 40)).astype(dt) for _ in range(4))
        for kw in ({}, {"is_causal": True}, {"softcap": 5.0}):
            out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
            want = reference.attention_backward(g, q, k, v, out, lse, **kw)

            def call(q=q, k=k, v=v, g=g, kw=kw):
                o, s = fastattn.attention(q, k, v, return_lse=True, **kw)
                return list(fastattn.attention_backward(g, q, k, v, o, s, **kw))
            yield ("backward", np.dtype(dt).name, sorted(kw)), call, list(want), btol, np.dtype(dt)


def int8_case():
    cache = fastattn.KVCache(1, 2, 32, max_len=64, dtype="int8")
    ks, vs = (rng.standard_normal((1, 2, 50, 32)).astype(np.float32) for _ in range(2))
    cache.append(ks, vs)
    qd = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
    kd = cache.keys.astype(np.float64) * cache.key_scales[..., None]
    vd = cache.values.astype(np.float64) * cache.value_scales[..., None]
    want = reference.attention(qd.astype(np.float64), kd, vd)
    yield ("int8 cache",), lambda: [cache.attend(qd)], [want], 1e-4, np.dtype(np.float32)


def paged_cases():
    """attention_paged on a mixed batch (a 6-token prefill chunk, two decodes),
    float32, bfloat16 and int8 pools, against each sequence's gathered keys."""
    nb, bs, hk, hq, e = 12, 16, 2, 4, 32
    lens, nq = np.array([37, 20, 50]), np.array([6, 1, 1])
    table = rng.permutation(nb)[:12].reshape(3, 4).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), hq, e)).astype(np.float32)
    kc, vc = (rng.standard_normal((nb, bs, hk, e)).astype(np.float32) for _ in range(2))
    for name in ("float32", "bfloat16", "int8"):
        if name == "int8":
            ksc, vsc = (np.abs(x).max(-1) / 127 for x in (kc, vc))
            k8, v8 = (np.round(x / sc[..., None]).astype(np.int8) for x, sc in ((kc, ksc), (vc, vsc)))
            args, kw = (k8, v8), {"key_scales": ksc.astype(np.float32),
                                  "value_scales": vsc.astype(np.float32)}
            kd, vd = k8 * ksc[..., None], v8 * vsc[..., None]
        else:
            dt = np.float32 if name == "float32" else ml_dtypes.bfloat16
            args, kw = (kc.astype(dt), vc.astype(dt)), {}
            kd, vd = (x.astype(np.float64) for x in args)
        want = []
        for b in range(3):
            rows = np.concatenate([np.arange(bs) + blk * bs for blk in table[b]])[:lens[b]]
            kb, vb = (x.reshape(nb * bs, hk, e)[rows].transpose(1, 0, 2) for x in (kd, vd))
            qb = q[cu[b]:cu[b + 1]].astype(np.float64).transpose(1, 0, 2)
            want.append(reference.attention(qb, kb, vb, is_causal="lower_right",
                                            enable_gqa=True).transpose(1, 0, 2))
        yield (("paged", name), lambda args=args, kw=kw: [fastattn.attention_paged(
                   q, *args, table, lens, cu_seqlens_q=cu, **kw)],
               [np.concatenate(want)], 1e-4 if name != "bfloat16" else 3e-2,
               np.dtype(np.float32))


cases = [*forward_cases(), *backward_cases(), *int8_case(), *paged_cases()]
for isa in ISAS:
    fastattn.set_isa(isa)
    for what, call, want, tol, dtype in cases:
        for a, b in zip(call(), want):
            err = np.nanmax(np.abs(a.astype(np.float64) - b))
            if what[0] == "backward":
                err /= max(1.0, np.max(np.abs(b)))
            assert a.dtype == dtype and err < tol, (isa, what, a.dtype, err)
    print(isa, "ok:", len(cases), "cases (4 dtypes x masks, window, soft cap, GQA, decoding;"
          " the backward pass; the int8 cache; paged caches)")

"""The aarch64 smoke test (.ci/aarch64.sh, .ci/build_wheel_aarch64.sh), run
under qemu-aarch64 with FASTATTN_ISA naming the path: every dtype and the
main features on it against fastattn.reference (masks, window, soft cap,
GQA, decoding, the backward pass, the int8 cache)."""
import os

import ml_dtypes
import numpy as np

import fastattn
from fastattn import reference

assert fastattn.get_isa() == os.environ["FASTATTN_ISA"], fastattn.get_isa()
print("fastattn", fastattn.__version__, "isa", fastattn.get_isa(), "of", fastattn.available_isas())
rng = np.random.default_rng(7)
tol = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}
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
            got = fastattn.attention(q, k, v, enable_gqa=hq != hk, **kw)
            want = reference.attention(*f64, enable_gqa=hq != hk, **kw)
            err = np.nanmax(np.abs(got.astype(np.float64) - want))
            assert got.dtype == np.dtype(dt) and err < tol[name], (name, L, S, kw, err)
    print(name, "ok")
for dt, btol in ((np.float32, 1e-4), (np.float64, 1e-10)):
    q, k, v, g = (rng.standard_normal((2, 3, 45, 40)).astype(dt) for _ in range(4))
    for kw in ({}, {"is_causal": True}, {"softcap": 5.0}):
        out, lse = fastattn.attention(q, k, v, return_lse=True, **kw)
        got = fastattn.attention_backward(g, q, k, v, out, lse, **kw)
        want = reference.attention_backward(g, q, k, v, out, lse, **kw)
        for a, b in zip(got, want):
            err = np.max(np.abs(a - b)) / max(1.0, np.max(np.abs(b)))
            assert a.dtype == np.dtype(dt) and err < btol, (np.dtype(dt).name, kw, err)
    print("backward", np.dtype(dt).name, "ok")
cache = fastattn.KVCache(1, 2, 32, max_len=64, dtype="int8")
ks, vs = (rng.standard_normal((1, 2, 50, 32)).astype(np.float32) for _ in range(2))
cache.append(ks, vs)
qd = rng.standard_normal((1, 2, 1, 32)).astype(np.float32)
out = cache.attend(qd)
kd = cache.keys.astype(np.float64) * cache.key_scales[..., None]
vd = cache.values.astype(np.float64) * cache.value_scales[..., None]
ref = reference.attention(qd.astype(np.float64), kd, vd)
assert np.max(np.abs(out - ref)) < 1e-4, np.max(np.abs(out - ref))
print("int8 cache ok")

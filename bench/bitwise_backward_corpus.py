"""A fixed, seeded corpus of fastattn's gradients, to prove a change to the
backward bitwise neutral (bitwise_corpus.py's sibling for the forward).

    python bench/bitwise_backward_corpus.py save OUT.npz          # every ISA path
    python bench/bitwise_backward_corpus.py save OUT.npz generic avx2
    python bench/bitwise_backward_corpus.py compare A.npz B.npz

`save` runs every case on every ISA path `fastattn.available_isas()` gives (or
on those named after OUT): `attention_backward` in float32, float64, float16
and bfloat16 on shapes on and off the tile sizes, not causal, causal
upper-left and lower-right, on 1 and 2 threads; at one shape each option (a
window, a soft cap (alone, with a window, with ALiBi), ALiBi, sinks, key
padding, a bool mask with a row that sees nothing, a float mask whose
gradient is asked for, shared by the batch, with and without a soft cap,
`grad_lse`, grouped-query heads), NaN and Inf in hidden keys and values
(with and without a soft cap), scores large enough that rounding puts them
above their row's lse; and `attention_varlen_backward`.  Each gradient is
stored under `<isa>/<case>/<i>`; `save` and `compare` are bitwise_corpus.py's
(`compare` exits 1 on any difference or missing case).

Only the public API is used: run it from another checkout (cwd) by this
file's absolute path to save that build's gradients.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bitwise_corpus import compare, save  # noqa: E402

OPTION_SHAPE = (2, 4, 150, 170, 32)   # B, H, L, S, E (= Ev)


def _inputs(rng, dt, B, H, L, S, E, Ev, Hkv=None):
    q = rng.standard_normal((B, H, L, E)).astype(dt)
    k = rng.standard_normal((B, Hkv or H, S, E)).astype(dt)
    v = rng.standard_normal((B, Hkv or H, S, Ev)).astype(dt)
    do = rng.standard_normal((B, H, L, Ev)).astype(dt)
    return q, k, v, do


def _fwd_bwd(fa, q, k, v, do, nt, mask=None, *, grad_lse=False, mask_grad=False, **kw):
    """attention(return_lse=True), then attention_backward with the same
    options (and a seeded grad_lse, the mask's gradient, where asked)."""
    out, lse = fa.attention(q, k, v, mask, return_lse=True, num_threads=nt, **kw)
    if grad_lse:
        kw["grad_lse"] = np.random.default_rng(5).standard_normal(lse.shape).astype(lse.dtype)
    return fa.attention_backward(do, q, k, v, out, lse, mask, num_threads=nt,
                                 return_mask_grad=mask_grad, **kw)


def _shape_cases(fa, dt, dn):
    cases = []
    for (B, H, L, S, E, Ev) in [(1, 2, 64, 64, 64, 64), (2, 3, 37, 53, 24, 40),
                                (1, 2, 200, 300, 64, 64), (1, 1, 67, 129, 33, 17),
                                (1, 2, 130, 130, 128, 128)]:
        for causal in (False, True, "lower_right"):
            for nt in (1, 2):
                def run(B=B, H=H, L=L, S=S, E=E, Ev=Ev, causal=causal, nt=nt):
                    rng = np.random.default_rng(hash((B, H, L, S, E, Ev)) % 2**32)
                    q, k, v, do = _inputs(rng, dt, B, H, L, S, E, Ev)
                    return _fwd_bwd(fa, q, k, v, do, nt, is_causal=causal)
                cases.append((f"bwd/{dn}/{B}x{H}x{L}x{S}x{E}x{Ev}/c={causal}/nt={nt}", run))
    return cases


def _option_kwargs(dt, rng):
    """name -> (the attention options, the mask or None) at OPTION_SHAPE."""
    B, H, L, S, E = OPTION_SHAPE
    bool_mask = rng.random((B, H, L, S)) < 0.7
    bool_mask[:, :, 5] = False                       # a row that sees nothing
    pad = rng.random((B, S)) < 0.2
    bias = rng.standard_normal((1, H, L, S)).astype(dt)
    return {
        "window": ({"is_causal": True, "window": (31, 0)}, None),
        "softcap": ({"softcap": 5.0}, None),
        "softcap_window": ({"is_causal": True, "window": (31, 0), "softcap": 5.0}, None),
        "softcap_alibi": ({"is_causal": "lower_right", "softcap": 5.0,
                           "alibi_slopes": np.linspace(0.1, 1, H)}, None),
        "alibi": ({"is_causal": True, "alibi_slopes": np.linspace(0.1, 1, H)}, None),
        "sinks": ({"sinks": np.linspace(-1, 1, H).astype(np.float32)}, None),
        "key_padding": ({"key_padding_mask": pad}, None),
        "bool_mask": ({}, bool_mask),
        "bias_grad": ({"mask_grad": True}, bias),
        "bias_grad_softcap": ({"mask_grad": True, "softcap": 5.0}, bias),
        "grad_lse": ({"is_causal": True, "grad_lse": True}, None),
    }


def _option_cases(fa, dt, dn):
    cases = []
    for name in _option_kwargs(dt, np.random.default_rng(0)):
        for nt in (1, 2):
            def run(name=name, nt=nt):
                rng = np.random.default_rng(21)
                kw, mask = _option_kwargs(dt, rng)[name]
                q, k, v, do = _inputs(rng, dt, *OPTION_SHAPE, OPTION_SHAPE[-1])
                return _fwd_bwd(fa, q, k, v, do, nt, mask, **dict(kw))
            cases.append((f"opt/{dn}/{name}/nt={nt}", run))
    return cases


def _odd_cases(fa, dt, dn):
    def gqa(nt):
        rng = np.random.default_rng(31)
        q, k, v, do = _inputs(rng, dt, 2, 8, 70, 90, 64, 64, Hkv=2)
        return _fwd_bwd(fa, q, k, v, do, nt, is_causal=True, enable_gqa=True)

    def hidden_nonfinite(nt, **kw):
        rng = np.random.default_rng(33)
        q, k, v, do = _inputs(rng, dt, 1, 2, 40, 60, 32, 32)
        k[0, 0, 50], v[0, 1, 55] = np.nan, np.inf      # keys 50.. hidden below
        pad = np.zeros((1, 60), bool)
        pad[0, 50:] = True
        return _fwd_bwd(fa, q, k, v, do, nt, key_padding_mask=pad, **kw)

    def hidden_nonfinite_softcap(nt):
        return hidden_nonfinite(nt, softcap=5.0)

    def large_scores(nt):
        rng = np.random.default_rng(35)
        q, k, v, do = _inputs(rng, dt, 1, 2, 50, 70, 32, 32)
        q = (q.astype(np.float64) * 300).astype(dt)   # scores ~1e3..1e4: lse below the max
        return _fwd_bwd(fa, q, k, v, do, nt, is_causal=True)

    def varlen(nt):
        rng = np.random.default_rng(37)
        cu = np.array([0, 17, 80, 81, 200])
        q, k, v, do = (rng.standard_normal((200, 4, 32)).astype(dt) for _ in range(4))
        out, lse = fa.attention_varlen(q, k, v, cu, cu, is_causal=True, return_lse=True,
                                       num_threads=nt)
        return fa.attention_varlen_backward(do, q, k, v, out, lse, cu, cu, is_causal=True,
                                            num_threads=nt)

    return [(f"odd/{dn}/{f.__name__}/nt={nt}", (lambda f=f, nt=nt: f(nt)))
            for f in (gqa, hidden_nonfinite, hidden_nonfinite_softcap, large_scores, varlen)
            for nt in (1, 2)]


def backward_cases(fa, dtypes=()):
    """(name, thunk) pairs in the four dtypes (those named in dtypes, if any)."""
    import ml_dtypes
    cases = []
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        dn = np.dtype(dt).name
        if dtypes and dn not in dtypes:
            continue
        for family in (_shape_cases, _option_cases, _odd_cases):
            cases += family(fa, dt, dn)
    return cases


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3:], cases=backward_cases)
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)

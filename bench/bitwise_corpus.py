"""A fixed, seeded corpus of fastattn results, to prove a refactoring bitwise neutral.

    python bench/bitwise_corpus.py save OUT.npz       # run the corpus, store every result
    python bench/bitwise_corpus.py save OUT.npz neon  # only on the ISA paths named
    python bench/bitwise_corpus.py save OUT.npz neon_bf16 --dtypes bfloat16  # only those inputs
    python bench/bitwise_corpus.py compare A.npz B.npz

`save` runs every case on every ISA path `fastattn.available_isas()` gives
(or on those named after OUT):
attention in float32/float64 (and float16 and bfloat16 input: on the
bfloat16 tiers the 16-bit matrix driver) with upper-left/lower-right
causal, bool/additive/key-padding masks, grouped-query heads, decoding
(L = 1..8 against long S: the key-split path), paged decoding and mixed
batches (attention_paged; int8 pools too), L and S off the tile sizes, the weights
path, out=, 1 and 2 threads, block-sparse bool masks, non-finite values in hidden
positions; softmax; multi_head_attention and KVCache decoding.  Each result is stored
under a name `<isa>/<case>`.  `compare` prints the case counts and exits 1 on
any difference (same dtype and shape; np.array_equal with equal_nan=True for floats,
the bytes for the rest, bfloat16 included) or
on a case missing from either file.

Only the public API is used, so the script runs against any build: to compare
against another checkout's build, run it from that checkout (cwd) calling this
file by its absolute path.
"""
import functools
import itertools
import sys

import numpy as np


def _qkv(rng, dt, shape_q, shape_k, ev=None):
    q = rng.standard_normal(shape_q).astype(dt)
    k = rng.standard_normal(shape_k).astype(dt)
    vs = shape_k[:-1] + ((ev if ev is not None else shape_k[-1]),)
    v = rng.standard_normal(vs).astype(dt)
    return q, k, v


def _attn_cases(fa, dt, dn):
    """Attention on every shape, causal form and thread count."""
    cases = []
    for (B, H, L, S, E, Ev) in [(1, 2, 64, 64, 64, 64), (2, 3, 37, 53, 24, 40),
                                (1, 2, 200, 300, 64, 64), (1, 1, 67, 129, 33, 17),
                                (1, 2, 130, 130, 128, 128), (1, 2, 48, 9000, 64, 64)]:
        for causal in (False, True, "lower_right"):
            for nt in (1, 2):
                def run(B=B, H=H, L=L, S=S, E=E, Ev=Ev, causal=causal, nt=nt, dt=dt):
                    rng = np.random.default_rng(hash((B, H, L, S, E, Ev)) % 2**32)
                    q, k, v = _qkv(rng, dt, (B, H, L, E), (B, H, S, E), Ev)
                    return fa.attention(q, k, v, is_causal=causal, num_threads=nt)
                cases.append((f"attn/{dn}/{B}x{H}x{L}x{S}x{E}x{Ev}/c={causal}/nt={nt}", run))
    return cases


def _decode_cases(fa, dt, dn):
    """Decoding against long S: the key-split and direct paths."""
    cases = []
    for L in range(1, 9):
        for S in (1500, 4133):
            for nt in (1, 2):
                def run(L=L, S=S, nt=nt, dt=dt):
                    rng = np.random.default_rng(1000 + L * 7 + S)
                    q, k, v = _qkv(rng, dt, (1, 4, L, 64), (1, 4, S, 64))
                    return fa.attention(q, k, v, is_causal="lower_right", num_threads=nt)
                cases.append((f"decode/{dn}/L={L}/S={S}/nt={nt}", run))
    return cases


def _shuffled_table(rng, lens, bs):
    """A block table giving the sequences of lengths lens the pool's blocks
    in a shuffled order (pages of bs keys); and the pool's block count."""
    nblk = (lens + bs - 1) // bs
    table = np.zeros((len(lens), nblk.max()), np.int32)
    perm = rng.permutation(int(nblk.sum())).astype(np.int32)
    for b, o in enumerate(np.cumsum(nblk) - nblk):
        table[b, :nblk[b]] = perm[o:o + nblk[b]]
    return table, len(perm)


def _paged_cases(fa, dt, dn):
    """attention_paged over shuffled blocks of a pool in the input's dtype
    (no float64 pools): decoding steps and a batch mixing a prefill chunk
    with decodes, grouped heads, both layouts, pages of 16 and 128 keys,
    head sizes of whole and odd vectors; the output and the lse."""
    if dn == "float64":
        return []
    lens = np.array([1, 17, 130, 300, 513])

    def run(E, bs, layout, mixed, nt):
        rng = np.random.default_rng(2000 + E + bs)
        table, nb = _shuffled_table(rng, lens, bs)
        shape = (nb, bs, 2, E) if layout == "NHD" else (nb, 2, bs, E)
        kc = rng.standard_normal(shape).astype(dt)
        vc = rng.standard_normal(shape).astype(dt)
        nq = np.array([1, 1, 20, 1, 1]) if mixed else np.ones(5, np.int64)
        cu = np.concatenate([[0], np.cumsum(nq)]) if mixed else None
        q = rng.standard_normal((int(nq.sum()), 8, E)).astype(dt)
        return fa.attention_paged(q, kc, vc, table, lens, cu_seqlens_q=cu, layout=layout,
                                  return_lse=True, num_threads=nt)

    return [(f"paged/{dn}/E={E}/bs={bs}/{layout}/mixed={mixed}/nt={nt}",
             functools.partial(run, E, bs, layout, mixed, nt))
            for E, bs, layout, mixed, nt in itertools.product(
                (128, 72), (16, 128), ("NHD", "HND"), (False, True), (1, 2))]


def _int8_cases(fa, dt, dn):
    """int8 paged pools with per-row scales under float32 queries: 1, 2, 3,
    4, 5 and 8 query rows per KV head (with the 6-query chunk, 1 to 6 and 8
    rows per kernel call), head sizes of whole 16-byte chunks and not (72),
    decoding steps and a prefill chunk, soft cap, a query row with a NaN;
    1 and 2 threads."""
    if dn != "float32":
        return []
    lens = np.array([1, 17, 130, 300, 513])

    def run(E, G, mixed, variant, nt):
        rng = np.random.default_rng(3000 + E * 10 + G)
        bs, hkv = 16, 2
        table, nb = _shuffled_table(rng, lens, bs)
        shape = (nb, bs, hkv, E)
        kc = rng.integers(-127, 128, shape, dtype=np.int8)
        vc = rng.integers(-127, 128, shape, dtype=np.int8)
        ks = rng.uniform(0.001, 0.05, shape[:3]).astype(np.float32)
        vs = rng.uniform(0.001, 0.05, shape[:3]).astype(np.float32)
        nq = np.array([1, 1, 6, 1, 1]) if mixed else np.ones(5, np.int64)
        cu = np.concatenate([[0], np.cumsum(nq)]) if mixed else None
        q = rng.standard_normal((int(nq.sum()), G * hkv, E)).astype(np.float32)
        kw = {}
        if variant == "softcap":
            kw["softcap"] = 3.0
        elif variant == "nan_row":
            q[1, 0, E // 2] = np.nan
        return fa.attention_paged(q, kc, vc, table, lens, cu_seqlens_q=cu, layout="NHD",
                                  key_scales=ks, value_scales=vs, return_lse=True,
                                  num_threads=nt, **kw)

    return [(f"paged_int8/E={E}/G={G}/mixed={mixed}/{variant}/nt={nt}",
             functools.partial(run, E, G, mixed, variant, nt))
            for E, G, mixed, variant, nt in itertools.product(
                (128, 72, 256, 64), (1, 2, 3, 4, 5, 8), (False, True),
                ("plain", "softcap", "nan_row"), (1, 2))]


def _masks_case(fa, dt, dn):
    def masks(dt=dt):
        rng = np.random.default_rng(7)
        q, k, v = _qkv(rng, dt, (2, 2, 70, 32), (2, 2, 150, 32))
        bm = rng.random((2, 2, 70, 150)) < 0.7
        bm[:, :, 5] = False  # a row with nothing visible
        am = rng.standard_normal((70, 150)).astype(dt)
        am[3, :40] = -np.inf
        pad = rng.random((2, 150)) < 0.2
        pad[1, :130] = True
        k2, v2 = k.copy(), v.copy()
        k2[0, 0, 10] = np.nan  # hidden by the bool mask below
        v2[0, 0, 10] = np.inf
        bm2 = bm.copy()
        bm2[0, 0, :, 10] = False
        out = np.full((2, 2, 70, 32), 7, dt)
        res = {
            "bool": fa.attention(q, k, v, attn_mask=bm),
            "add": fa.attention(q, k, v, attn_mask=am),
            "pad": fa.attention(q, k, v, key_padding_mask=pad),
            "pad_causal": fa.attention(q, k, v, key_padding_mask=pad, is_causal=True),
            "bool_lr": fa.attention(q, k, v, attn_mask=bm, is_causal="lower_right"),
            "hidden_nonfinite": fa.attention(q, k2, v2, attn_mask=bm2),
            "out=": fa.attention(q, k, v, is_causal=True, out=out),
            "strided": fa.attention(q[..., ::-1, :], np.swapaxes(np.swapaxes(k, -1, -2).copy(),
                                                                 -1, -2), v[..., ::2]),
            "nan_visible": fa.attention(q, np.where(np.arange(150)[:, None] == 20, np.nan,
                                                    k).astype(dt), v),
            "scale": fa.attention(q, k, v, scale=0.37),
        }
        for nt in (1, 2):
            res[f"weights/nt={nt}"] = fa.attention(q, k, v, attn_mask=bm, is_causal=True,
                                                   key_padding_mask=pad, return_weights=True,
                                                   num_threads=nt)
            res[f"weights_add/nt={nt}"] = fa.attention(q, k, v, attn_mask=am,
                                                       return_weights=True, num_threads=nt)
        return res
    return [(f"masks/{dn}", masks)]


def _block_sparse_case(fa, dt, dn):
    def block_sparse(dt=dt):
        # bool masks hiding or showing whole (tile x key block) regions:
        # the per-call mask summary's skip / visible / mixed states
        rng = np.random.default_rng(19)
        res = {}
        for (L, S) in ((300, 700), (4, 1500)):
            q, k, v = _qkv(rng, dt, (2, 2, L, 64), (2, 2, S, 64))
            i = np.arange(L)[:, None] + (S - L)
            j = np.arange(S)[None, :]
            first = np.broadcast_to(j < 160, (L, S))
            band = (j <= i) & (j > i - 200)
            per_b = np.stack([first, band])[:, None]  # (2, 1, L, S): per batch
            rnd = rng.random((2, 2, L, S)) < 0.5
            rnd[:, :, :, 256:384] = True
            rnd[:, :, :, 512:640] = False
            for nt in (1, 2):
                for name, m in (("first", first), ("causal", j <= i), ("band", band),
                                ("per_batch", per_b), ("mixed", rnd)):
                    for c in (False, "lower_right"):
                        res[f"{L}x{S}/{name}/c={c}/nt={nt}"] = fa.attention(
                            q, k, v, attn_mask=m, is_causal=c, num_threads=nt)
                res[f"{L}x{S}/band_w/nt={nt}"] = fa.attention(
                    q, k, v, attn_mask=band, return_weights=True, num_threads=nt)
                res[f"{L}x{S}/rows/nt={nt}"] = fa.attention(
                    q, k, v, attn_mask=np.broadcast_to(j < 300, (L, S))[:1],
                    num_threads=nt)
        return res
    return [(f"block_sparse/{dn}", block_sparse)]


def _gqa_case(fa, dt, dn):
    def gqa(dt=dt):
        rng = np.random.default_rng(11)
        res = {}
        for L in (1, 5, 90):
            q, k, v = _qkv(rng, dt, (2, 8, L, 64), (2, 2, 700, 64))
            for c in (False, "lower_right"):
                res[f"L={L}/c={c}"] = fa.attention(q, k, v, enable_gqa=True, is_causal=c)
        return res
    return [(f"gqa/{dn}", gqa)]


def _softmax_case(fa, dt, dn):
    def softmax(dt=dt):
        rng = np.random.default_rng(13)
        x = (rng.standard_normal((33, 257)) * 20).astype(dt)
        x[2, 5] = -np.inf
        x[4] = -np.inf
        x[6, 7] = np.nan
        mask = rng.random((33, 257)) < 0.8
        mask[9] = False
        big = rng.standard_normal((600, 800)).astype(dt)
        return {"rows": fa.softmax(x, axis=-1), "cols": fa.softmax(x, axis=0),
                "all": fa.softmax(x), "masked": fa.softmax(x, axis=-1, mask=mask),
                "big": fa.softmax(big, axis=-1), "tail": fa.softmax(x[:, :13], axis=1)}
    return [(f"softmax/{dn}", softmax)]


def _mha_case(fa, dt, dn):
    def mha(dt=dt):
        rng = np.random.default_rng(17)
        d, h, hkv = 64, 8, 2
        x = rng.standard_normal((2, 40, d)).astype(dt)
        wq = (rng.standard_normal((d, d)) / 8).astype(dt)
        wk = (rng.standard_normal((d, d // h * hkv)) / 8).astype(dt)
        wv = (rng.standard_normal((d, d // h * hkv)) / 8).astype(dt)
        wo = (rng.standard_normal((d, d)) / 8).astype(dt)
        res = {"prefill": fa.multi_head_attention(x, wq, wq, wq, wo, h, is_causal=True),
               "gqa_w": fa.multi_head_attention(x, wq, wk, wv, wo, h, num_kv_heads=hkv,
                                                return_weights=True)}
        cache = fa.KVCache(2, hkv, d // h, max_len=700, dtype=dt)
        res["cache_prefill"] = fa.multi_head_attention(
            x, wq, wk, wv, wo, h, num_kv_heads=hkv, kv_cache=cache, is_causal="lower_right")
        for t in range(3):
            xt = rng.standard_normal((2, 1, d)).astype(dt)
            res[f"cache_step{t}"] = fa.multi_head_attention(
                xt, wq, wk, wv, wo, h, num_kv_heads=hkv, kv_cache=cache,
                is_causal="lower_right")
        big = rng.standard_normal((2, 600, d)).astype(dt)
        cache.append(np.zeros((2, hkv, 600, d // h), dt) + big[:, None, :, :d // h] * 0.1,
                     np.zeros((2, hkv, 600, d // h), dt) + big[:, None, :, d // h:2 * d // h])
        res["cache_long"] = fa.multi_head_attention(xt, wq, wk, wv, wo, h, num_kv_heads=hkv,
                                                    kv_cache=cache, is_causal="lower_right")
        return res
    return [(f"mha/{dn}", mha)]


def attention_cases(fa, dtypes=()):
    """(name, thunk) pairs; every thunk returns an array or a tuple of arrays.
    dtypes: the input dtypes' names to run (all four when empty)."""
    import ml_dtypes
    cases = []
    for dt in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        dn = np.dtype(dt).name
        if dtypes and dn not in dtypes:
            continue
        for family in (_attn_cases, _decode_cases, _paged_cases, _int8_cases, _masks_case,
                       _block_sparse_case, _gqa_case, _softmax_case, _mha_case):
            cases += family(fa, dt, dn)
    return cases


def flatten(name, r, out):
    if isinstance(r, dict):
        for k, v in r.items():
            flatten(f"{name}/{k}", v, out)
    elif isinstance(r, tuple):
        for i, v in enumerate(r):
            flatten(f"{name}/{i}", v, out)
    else:
        out[name] = np.asarray(r)


def save(path, only=(), dtypes=(), cases=attention_cases):
    """Run ``cases(fa, dtypes)``'s (name, thunk) pairs on the ISA paths
    ``only`` (every available one when empty) and store their results."""
    import fastattn as fa
    res = {}
    old = fa.get_isa()
    isas = tuple(only) or fa.available_isas()
    try:
        for isa in isas:
            fa.set_isa(isa)
            for name, thunk in cases(fa, dtypes):
                flatten(f"{isa}/{name}", thunk(), res)
    finally:
        fa.set_isa(old)
    np.savez_compressed(path, **res)
    print(f"saved {len(res)} arrays ({', '.join(isas)}; fastattn from {fa.__file__}) to {path}")


def _equal(x, y):
    """Bitwise equal, NaN included: bfloat16 comes back from np.load as a
    2-byte void dtype, compared by its bytes like every non-float."""
    if x.dtype.kind in "fc":
        return np.array_equal(x, y, equal_nan=True)
    return x.tobytes() == y.tobytes()


def compare(pa, pb):
    a, b = np.load(pa), np.load(pb)
    ka, kb = set(a.files), set(b.files)
    bad = 0
    for k in sorted(ka ^ kb):
        print(f"only in {'A' if k in ka else 'B'}: {k}")
        bad += 1
    same = 0
    for k in sorted(ka & kb):
        x, y = a[k], b[k]
        if x.dtype == y.dtype and x.shape == y.shape and _equal(x, y):
            same += 1
        else:
            print(f"DIFFERS: {k} ({x.dtype}{x.shape} vs {y.dtype}{y.shape})")
            bad += 1
    per_isa = {}
    for k in ka & kb:
        per_isa[k.split("/")[0]] = per_isa.get(k.split("/")[0], 0) + 1
    print(f"{len(ka & kb)} common cases {per_isa}, {same} bitwise identical, {bad} differing "
          f"or missing")
    return 1 if bad or not same else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "save":
        args = sys.argv[3:]
        dtypes = ()
        if "--dtypes" in args:
            at = args.index("--dtypes")
            if at + 1 >= len(args):
                sys.exit("--dtypes needs a comma-separated list of dtype names")
            dtypes = tuple(args[at + 1].split(","))
            unknown = set(dtypes) - {"float32", "float64", "float16", "bfloat16"}
            if unknown:
                sys.exit(f"--dtypes: unknown {sorted(unknown)} (float32, float64, float16, bfloat16)")
            del args[at:at + 2]
        save(sys.argv[2], args, dtypes)
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)

"""What a benchmark run measures: the sections, the suites, the timing budgets
(profiles), the cases and their inputs, and the parsing of ``--shapes`` and
``--threads``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SECTIONS = ("attention", "decode", "overhead", "float64", "softmax", "memory", "variants",
            "backward", "dask", "serving")
# sections that run only when asked for (each in its own module)
ON_REQUEST = ("dask", "serving")
# name: sections it runs (the quick suite takes the QUICK profile below; the
# variants section, long sequences, is left out of it; the dask section, a
# cluster and minutes of work, and the serving section, GiBs of caches, run
# only when asked for)
SUITES = {
    "default": tuple(s for s in SECTIONS if s not in ON_REQUEST),
    "quick": tuple(s for s in SECTIONS if s not in ("variants",) + ON_REQUEST),
    "variants": ("variants",),
    "backward": ("backward",),
    "dask": ("dask",),
    "serving": ("serving",),
}
VARIANT_W = 512  # the variants section: its window, and the keys its bool mask shows
# The variants section.  Masks and windows at a long sequence, each also timed
# in the peers with the equivalent dense boolean mask (variant_visible); the
# score options against the plain causal call at a shorter one, fastattn only
# (no peer has them).
MASK_VARIANTS = ("plain", "causal", "window512", "bool_first512", "bool_causal")
# The packed batch: B causal sequences of lengths spread over L/32 .. L (64
# .. 2048 at L = 2048) through attention_varlen, against the same sequences
# padded to L with a key_padding_mask in one attention call (fastattn both).
VARLEN_VARIANTS = ("varlen",)
# name: the keywords of a causal call with that option, given the heads H
SCORE_VARIANTS = {
    "softcap": lambda H: {"softcap": 30.0},
    "alibi": lambda H: {"alibi_slopes": 2.0 ** (-8.0 * np.arange(1, H + 1) / H)},
    "sinks": lambda H: {"sinks": np.linspace(-1.0, 1.0, H)},
    "return_lse": lambda H: {"return_lse": True},
}
# The 16-bit storage dtypes (read in place, float32 arithmetic): their
# prefill cases in the attention section, and with float32 the dtypes of the
# decode section's KV caches (one row each, GB/s of cache read beside the
# machine's read bandwidth; a new cache dtype is one more name here).
HALF_DTYPES = ("float16", "bfloat16")
CACHE_DTYPES = ("float32",) + HALF_DTYPES
# other names of a suite
SUITE_ALIASES = {"targets": "default", "all": "default"}


def suite_names() -> list[str]:
    """Every name ``--suite`` takes for a whole suite, aliases included."""
    return [*SUITES, *SUITE_ALIASES]


def suite_sections(name: str) -> tuple | None:
    """The sections of the suite (or alias) ``name``; None if there is none."""
    return SUITES.get(SUITE_ALIASES.get(name, name))


# --------------------------------------------------------------------------
# Suite definitions
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Profile:
    """Timing budgets of a suite."""
    budget_s: float        # aim for this much timed work per measurement
    min_repeats: int
    max_repeats: int
    min_sample_s: float    # a sample lasts at least this long (loops of calls)
    slow_budget_s: float   # at most this much for one very slow implementation
    peak_n: int            # size of the square matmul for the FLOP peak
    peak_repeats: int
    probe_s: float         # one call of the FMA peak probe lasts about this long
    round_probe_s: float   # the FMA probe timed in every round of a case (1 thread)
    attention: tuple       # (B, H, L, S, D) shapes
    decode: tuple
    overhead: tuple
    float64: tuple
    softmax: tuple         # (M, N) shapes
    memory: tuple          # (H, L, S, D)
    variants: tuple        # ((B, H, L, S, D), variant names) of the variants section
    # ((B, H, L, S, D), causal flags) timed in HALF_DTYPES too (with --dtype float32)
    half_prefill: tuple = ()
    # the backward section: ((B, H, L, S, D), causal) forward + backward vs torch,
    # float32 and bfloat16; and the (B, H, L, S, D) of its score options vs the
    # eager formula (() for none)
    backward: tuple = ()
    backward_options: tuple = ()
    # its learned-bias rows: ((B, H, L, S, D), the bias's shape), float32 and
    # bfloat16, the bias requiring grad, vs torch SDPA
    backward_bias: tuple = ()
    # decoding steps of grouped-query attention: ((B, H, L, S, D), KV heads),
    # timed in the decode section's cache dtypes beside its plain steps
    decode_gqa: tuple = ()


DEFAULT = Profile(
    budget_s=1.5, min_repeats=7, max_repeats=11, min_sample_s=0.02, slow_budget_s=3.5,
    peak_n=2048, peak_repeats=5, probe_s=0.05, round_probe_s=0.02,
    attention=((1, 8, 1024, 1024, 64), (1, 8, 2048, 2048, 64),
               (1, 4, 4096, 4096, 64), (1, 8, 1024, 1024, 128),
               (4, 16, 256, 256, 64)),
    decode=((1, 32, 1, 4096, 128),),
    decode_gqa=(((1, 32, 1, 4096, 128), 8),),
    overhead=((1, 1, 3, 3, 2),),
    float64=((1, 8, 1024, 1024, 64),),
    softmax=((2048, 4096),),
    memory=(1, 8192, 8192, 64),
    variants=(((1, 8, 8192, 8192, 64), MASK_VARIANTS),
              ((1, 8, 2048, 2048, 64), ("causal",) + tuple(SCORE_VARIANTS)),
              ((16, 8, 2048, 2048, 64), VARLEN_VARIANTS)),
    half_prefill=(((1, 8, 1024, 1024, 64), (False, True)), ((1, 8, 2048, 2048, 64), (True,))),
    backward=(((1, 8, 1024, 1024, 64), False), ((1, 8, 2048, 2048, 64), True),
              ((1, 8, 1024, 1024, 128), False)),
    backward_options=(1, 8, 8192, 8192, 64),
    backward_bias=(((4, 8, 512, 512, 64), (1, 8, 512, 512)),),
)

QUICK = Profile(
    budget_s=0.1, min_repeats=3, max_repeats=4, min_sample_s=0.005, slow_budget_s=0.5,
    peak_n=1024, peak_repeats=3, probe_s=0.01, round_probe_s=0.005,
    attention=((1, 4, 256, 256, 64), (2, 2, 128, 128, 32)),
    decode=((1, 8, 1, 1024, 64),),
    decode_gqa=(((1, 8, 1, 1024, 64), 2),),
    overhead=((1, 1, 3, 3, 2),),
    float64=((1, 4, 256, 256, 64),),
    softmax=((256, 1024),),
    memory=(1, 1024, 1024, 64),
    variants=(((1, 2, 2048, 2048, 64), MASK_VARIANTS),
              ((1, 2, 256, 256, 64), ("causal",) + tuple(SCORE_VARIANTS)),
              ((16, 2, 256, 256, 64), VARLEN_VARIANTS)),
    half_prefill=(((1, 4, 256, 256, 64), (False, True)),),
    backward=(((1, 2, 256, 256, 64), False), ((1, 2, 256, 256, 32), True)),
    backward_options=(1, 2, 1024, 1024, 64),
    backward_bias=(((2, 2, 128, 128, 32), (1, 2, 128, 128)),),
)


@dataclass
class Case:
    """One timed case: a section's shape, dtype and mask."""
    section: str
    kind: str               # "attention" | "softmax"
    shape: tuple            # (B, H, L, S, D) or (M, N)
    dtype: str
    causal: bool = False
    variant: str = ""       # the variants section: a name of variant_kwargs
    kv_heads: int = 0       # K and V heads of grouped-query attention (0: H)

    @property
    def label(self) -> str:
        if self.kind == "softmax":
            return "softmax %dx%d" % self.shape
        B, H, L, S, D = self.shape
        s = f"{B}x{H}x{L}x{D}" if L == S else f"{B}x{H}x{L}x{S}x{D}"
        s = f"{s} {self.variant}" if self.variant else s
        s = f"{s} kv_heads={self.kv_heads}" if self.kv_heads else s
        return f"{self.section} {s}" if self.section != "attention" else s

    def kv_bytes(self) -> int:
        """Bytes of K and V an attention case reads (a decoding step: its cache)."""
        B, _, _, S, D = self.shape
        return 2 * B * self.heads_kv * S * D * storage_dtype(self.dtype).itemsize

    @property
    def heads_kv(self) -> int:
        """The heads of K and V: kv_heads, or H where the case has no grouping."""
        return self.kv_heads or self.shape[1]

    def flops(self) -> float:
        if self.kind != "attention":
            return float("nan")
        B, H, L, S, D = self.shape
        if self.variant in VARLEN_VARIANTS:  # the work of the sequences, not of the padding
            n = varlen_lengths(B, L).astype(float)
            return 4.0 * H * D * float((n * (n + 1) / 2).sum())
        if self.variant:
            return 4.0 * B * H * D * float(variant_visible(self.variant, L, S).sum())
        return 4.0 * B * H * L * S * D * causal_fraction(L, S, self.causal)


def storage_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a case's dtype name ("bfloat16": ml_dtypes')."""
    from .._half import as_storage_dtype
    return as_storage_dtype(name)


def arith_dtype(name: str) -> str:
    """The arithmetic dtype of a case (its peaks): float32 for 16-bit ones."""
    return "float32" if name in HALF_DTYPES else name


def variant_causal(variant: str) -> bool:
    """Whether a variants-section case is causal (its flops and its label)."""
    return variant not in ("plain", "bool_first512")


def variant_has_peers(variant: str) -> bool:
    """Whether the peers time a variants-section case (with a dense mask)."""
    return variant not in SCORE_VARIANTS and variant not in VARLEN_VARIANTS


def varlen_lengths(B: int, L: int) -> np.ndarray:
    """The B sequence lengths of the varlen case: evenly spread over L/32 ..
    L, in a fixed shuffled order (int64)."""
    n = np.linspace(max(L // 32, 1), L, B).round().astype(np.int64)
    return n[np.random.default_rng(0).permutation(B)]


def varlen_inputs(case: "Case"):
    """The varlen case's packed (total, H, D) q, k, v and cu_seqlens, and the
    same sequences padded: (B, H, L, D) q, k, v (zeros past each length) and
    the (B, L) key_padding_mask (True = padding)."""
    B, H, L, S, D = case.shape
    n = varlen_lengths(B, L)
    cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    rng = np.random.default_rng(0)
    dt = np.dtype(case.dtype)
    packed = [rng.standard_normal((int(cu[-1]), H, D)).astype(dt) for _ in range(3)]
    padded = [np.zeros((B, H, L, D), dt) for _ in range(3)]
    for b in range(B):
        for x, y in zip(packed, padded):
            y[b, :, :n[b]] = np.swapaxes(x[cu[b]:cu[b + 1]], 0, 1)
    pad = np.arange(L)[None, :] >= n[:, None]
    return packed, cu, padded, pad


def variant_visible(variant: str, L: int, S: int) -> np.ndarray:
    """The (L, S) boolean mask (True = visible) of a variants-section case."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    if variant == "plain":
        return np.ones((L, S), bool)
    if variant in ("causal", "bool_causal") or variant in SCORE_VARIANTS:
        return j <= i
    if variant == "window512":
        return (j <= i) & (j >= i - (VARIANT_W - 1))
    if variant == "bool_first512":
        return np.broadcast_to(j < VARIANT_W, (L, S))
    raise ValueError(f"unknown variant {variant!r}")


def variant_kwargs(variant: str, H: int, L: int, S: int) -> dict:
    """fastattn.attention's arguments for a variants-section case: the native
    window, causal and score options, or a boolean mask."""
    if variant in SCORE_VARIANTS:
        return {"is_causal": True, **SCORE_VARIANTS[variant](H)}
    if variant == "plain":
        return {}
    if variant == "causal":
        return {"is_causal": True}
    if variant == "window512":
        return {"is_causal": True, "window": (VARIANT_W - 1, 0)}
    return {"attn_mask": variant_visible(variant, L, S)}



def causal_fraction(L: int, S: int, causal: bool) -> float:
    """Fraction of the L x S score matrix a (top-left) causal mask keeps."""
    if not causal:
        return 1.0
    if L == S:
        return 0.5          # the usual convention for square causal attention
    visible = sum(min(i + 1, S) for i in range(L))
    return visible / float(L * S)


def parse_shapes(text: str) -> list[tuple]:
    """``"B,H,L,D;B,H,L,S,D"`` -> list of (B, H, L, S, D)."""
    shapes = []
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        try:
            dims = tuple(int(x) for x in part.replace("x", ",").split(","))
        except ValueError:
            raise ValueError(f"bad shape {part!r}: expected integers B,H,L,D or B,H,L,S,D")
        if len(dims) == 4:
            B, H, L, D = dims
            dims = (B, H, L, L, D)
        if len(dims) != 5:
            raise ValueError(f"bad shape {part!r}: expected B,H,L,D or B,H,L,S,D")
        if min(dims) < 1:
            raise ValueError(f"bad shape {part!r}: all sizes must be >= 1")
        shapes.append(dims)
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def parse_int_list(text: str, what: str) -> list[int]:
    """``"1,2,2"`` -> [1, 2] (distinct integers >= 1, in order)."""
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"bad {what} {text!r}: expected comma-separated integers")
    if not vals or min(vals) < 1:
        raise ValueError(f"bad {what} {text!r}: expected integers >= 1")
    return list(dict.fromkeys(vals))


def build_cases(args, profile: Profile, sections) -> list[Case]:
    """The timed cases of ``sections`` (all but memory) for the options in
    ``args`` (dtype, causal, shapes)."""
    dt = args.dtype
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    cases = []
    if "attention" in sections:
        shapes = args.shapes_parsed if args.shapes_parsed else profile.attention
        for shp in shapes:
            for c in causals:
                cases.append(Case("attention", "attention", shp, dt, c))
        if dt == "float32" and not args.shapes_parsed:
            for shp, flags in profile.half_prefill:
                for hd in HALF_DTYPES:
                    for c in (c for c in causals if c in flags):
                        cases.append(Case("attention", "attention", shp, hd, c))
    if "decode" in sections:
        for shp, hkv in [(shp, 0) for shp in profile.decode] + list(profile.decode_gqa):
            for cd in (CACHE_DTYPES if dt == "float32" else (dt,)):
                cases.append(Case("decode", "attention", shp, cd, False, kv_heads=hkv))
    if "overhead" in sections:
        for shp in profile.overhead:
            cases.append(Case("overhead", "attention", shp, dt, False))
    if "float64" in sections:
        for shp in profile.float64:
            cases.append(Case("float64", "attention", shp, "float64", False))
    if "softmax" in sections:
        for shp in profile.softmax:
            cases.append(Case("softmax", "softmax", shp, dt, False))
    if "variants" in sections:
        for shp, names in profile.variants:
            for var in names:
                cases.append(Case("variants", "attention", shp, dt, variant_causal(var), var))
    return cases


def make_inputs(case: Case, seed: int = 0):
    """The inputs of ``case``: ``x`` (softmax) or ``(q, k, v)`` (attention)."""
    rng = np.random.default_rng(seed)
    dt = storage_dtype(case.dtype)
    if case.kind == "softmax":
        return (rng.standard_normal(case.shape) * 4).astype(dt)
    B, H, L, S, D = case.shape
    q = rng.standard_normal((B, H, L, D)).astype(dt)
    k = rng.standard_normal((B, case.heads_kv, S, D)).astype(dt)
    v = rng.standard_normal((B, case.heads_kv, S, D)).astype(dt)
    return q, k, v

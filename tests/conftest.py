"""Shared fixtures, hypothesis profile and helpers for the fastattn test suite.

Test modules import the plain helpers with ``from conftest import ...``:
neither tests/ nor its subfolders have an ``__init__.py``, so pytest puts
tests/ on ``sys.path`` when it loads this file, and each test file's own folder
when it imports that file.  Hence test file basenames are unique across the
folders, and no subfolder has a conftest.py of its own (it would take this
module's name); helpers shared inside one folder live in a plain module there
(api/api_common.py, mha/mha_common.py, numerics/fuzz_common.py).  The shared
helpers that must work without pytest (a fresh interpreter, the memory
probes) are in tests/support.py.

Only the tests whose result depends on the kernels take the ``isa`` fixture
and so run once per ISA path; the rest run once, on the default path.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os

# pytest-xdist's workers (`pytest -n auto`, the README's command) share the
# CPUs, so an OpenMP thread that waits for a busy sibling process should sleep,
# not spin; read by libgomp when fastattn's extension loads, below.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import fastattn
import fastattn.reference as reference
from fastattn import _half

# ---------------------------------------------------------------------------
# hypothesis: one fixed, derandomized profile so that failures reproduce
# ---------------------------------------------------------------------------

_SUPPRESS = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    # The ISA fixture is function scoped on purpose: it is set once per test
    # (not per example), which is exactly what we want.
    HealthCheck.function_scoped_fixture,
]

settings.register_profile(
    "fastattn",
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
# A longer run for local soak testing: FASTATTN_HYPOTHESIS_PROFILE=thorough.
settings.register_profile(
    "thorough",
    derandomize=True,
    deadline=None,
    max_examples=2000,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
# The sanitizer run (.ci/sanitize.sh): the same properties, fewer examples.
settings.register_profile(
    "ci-sanitize",
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.load_profile(os.environ.get("FASTATTN_HYPOTHESIS_PROFILE", "fastattn"))


def examples(n: int) -> int:
    """``n`` hypothesis examples for a test that sets its own count; an eighth
    of them (at least 5) under the sanitizer profile, where every call is
    several times slower; ten times as many under the soak profile
    (``thorough``), whose own max_examples a test's count would override."""
    profile = os.environ.get("FASTATTN_HYPOTHESIS_PROFILE")
    if profile == "ci-sanitize":
        return max(5, n // 8)
    if profile == "thorough":
        return 10 * n
    return n

# ---------------------------------------------------------------------------
# ISA fixture
# ---------------------------------------------------------------------------

ISAS = tuple(fastattn.available_isas())
FLOAT_DTYPES = (np.float32, np.float64)


# float32 and float64 on the bfloat16 tiers run exactly the avx512 kernels
# (tests/kernels/test_isa.py checks it bitwise; neon_bf16: the neon kernels,
# tests/kernels/test_neon_bf16.py), so a test parametrized over
# the isa fixture runs on those tiers only when it has a 16-bit dtype among its
# parameters (or is one of the tiers' own test files): the same float tests
# twice more would only lengthen CI.  Deselected, not skipped.  The int8 KV
# cache's kernel is their own (integer dot products, AVX512-VNNI): a test
# with int8 in its name or parameters runs there too.
_BF16_TIERS = ("amx", "avx512_bf16", "neon_bf16")


def _has_16_bit_param(params: dict) -> bool:
    for value in params.values():
        if isinstance(value, (str, type, np.dtype)):
            try:
                dt = _half.as_storage_dtype(value)   # "bfloat16" by name too
            except TypeError:
                continue
            if dt.itemsize == 2 and dt.kind in "fV":
                return True
    return False


# FASTATTN_TEST_ISAS=neon,neon_bf16: the tests parametrized over the ISA paths
# run on those paths only, for a CI step whose build adds paths to those
# another step runs: the SIMDe build of the neon kernels (.ci/neon_simde.sh)
# also offers this machine's x86 paths, compiled as in the plain build that
# the plain pytest step runs.  Deselected, not skipped; a name this build does
# not offer is an error.
def _only_isas():
    names = [n.strip() for n in os.environ.get("FASTATTN_TEST_ISAS", "").split(",") if n.strip()]
    unknown = [n for n in names if n not in ISAS]
    if unknown:
        raise pytest.UsageError(f"FASTATTN_TEST_ISAS={os.environ['FASTATTN_TEST_ISAS']!r}: "
                                f"{unknown} not among this build's ISA paths {list(ISAS)}")
    return names


def pytest_collection_modifyitems(config, items):
    only = _only_isas()
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        # (the file's name, not the node id: every node id of the amx tier holds "amx")
        redundant = (params.get("isa") in _BF16_TIERS and not _has_16_bit_param(params)
                     and "int8" not in item.name
                     and not item.path.name.startswith(("test_amx", "test_isa", "test_neon_bf16")))
        elsewhere = bool(only) and "isa" in params and params["isa"] not in only
        (drop if redundant or elsewhere else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@contextlib.contextmanager
def using_isa(name: str):
    """Run the body with the kernels of the ISA path ``name``, then restore
    the path in use before, whatever happens in between."""
    previous = fastattn.get_isa()
    fastattn.set_isa(name)
    assert fastattn.get_isa() == name
    try:
        yield name
    finally:
        fastattn.set_isa(previous)


@pytest.fixture(params=ISAS, ids=[f"isa={n}" for n in ISAS])
def isa(request):
    """Run the test once per ISA path of this machine, with its kernels.

    Only tests whose result depends on the kernels take it (numerics of the
    attention, softmax and decoding paths, thread determinism, the ISA
    paths' own tests); the rest of the suite runs once, on the default
    path."""
    with using_isa(request.param):
        yield request.param


@pytest.fixture
def rng():
    return np.random.default_rng(20240613)


# ---------------------------------------------------------------------------
# tolerances
# ---------------------------------------------------------------------------

_TOL = {
    np.dtype(np.float16): 2e-3,
    np.dtype(np.float32): 2e-5,
    np.dtype(np.float64): 1e-12,
}


def tol_for(dtype) -> float:
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        dtype = np.dtype(np.float64)
    return _TOL[dtype]


def finite_absmax(*arrays) -> float:
    """Largest finite |entry| over the arrays (1.0 if there is none)."""
    m = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        fin = a[np.isfinite(a)]
        if fin.size:
            m = max(m, float(np.abs(fin).max()))
    return m if m > 0 else 1.0


# The caches' state-machine tests (tests/paged/test_paged_cache_stateful.py,
# tests/mha/test_kv_cache_stateful.py), rows uniform in [-2, 2], queries in
# [-1, 1]: the rows a cache stores against the float32 rows given (half an
# ulp of float16 / bfloat16, and below float16's smallest normal, 2^-14, half
# its subnormals' spacing, 2^-25; half an int8 level of the row's largest value),
# and attention over the rows read back against the reference: float32
# arithmetic (1e-5); a 16-bit cache's P.V may take the weights rounded to its
# type (the bfloat16 tiers), each within 2^-9 (bfloat16) or 2^-11 (float16)
# of itself, times max|v| = 2; int8 on the integer paths: the weights' int16
# quantisation, (keys <= 40) * 0.504 / 32767 * max|v| < 1.3e-3, and the int16
# queries' under 1e-3 here.
CACHE_STORE_TOL = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                   "int8": 0.5 / 127}
CACHE_ATTEND_TOL = {"float32": 1e-5, "float16": 2.0 ** -10 + 1e-5, "bfloat16": 2.0 ** -8 + 1e-5,
                    "int8": 3e-3}


def check_stored(got, given, dtype):
    """Rows read back from a cache of ``dtype`` (a key of CACHE_STORE_TOL)
    against the rows appended (rows along the last axis)."""
    top = np.abs(given).max(axis=-1, keepdims=True) if dtype == "int8" else np.abs(given)
    tiny = 2.0 ** -25 if dtype == "float16" else 0.0
    assert np.all(np.abs(got - given) <= CACHE_STORE_TOL[dtype] * top + 1e-7 * top + tiny)


# The tiers whose int8 KV cache kernel runs on integer dot products
# (src_c/kernels/decode_q8_dot.h: VPMADDWD on avx2, AVX512-VNNI on the
# bfloat16 tiers), and its keys per block.
Q8_DOT_ISAS = ("avx2", "avx512_bf16", "amx")
Q8_KC = 128


def q8_query(isa, q):
    """The float32 queries q (rows along the last axis) as the int8 kernel
    reads them on the tiers of Q8_DOT_ISAS, in float64: each row with a =
    max|q_r| > 0 finite quantised to q16 = rint(fl(fl(q / a) 32767)), ties
    to even, and read back as fl(a / 32767) q16; q itself elsewhere (and for
    a row with a NaN or infinity, which runs the float kernel)."""
    q = np.asarray(q, np.float32)
    if isa not in Q8_DOT_ISAS:
        return q.astype(np.float64)
    with np.errstate(invalid="ignore"):
        a = np.abs(q).max(axis=-1, keepdims=True)
    ok = np.isfinite(a) & (a > 0)
    safe = np.where(ok, a, np.float32(1))
    q16 = np.rint((q / safe) * np.float32(32767))
    sq = (safe / np.float32(32767)).astype(np.float32)
    return np.where(ok, sq.astype(np.float64) * q16, q.astype(np.float64))


def q8_dot_bound(isa, q, k8, k_scales, v8, v_scales, scale, keys=Q8_KC):
    """(query_out, query_lse, weights_out, weights_typical): bounds on the
    errors that the int8 kernel's integer dot products add on the tiers of
    Q8_DOT_ISAS (zeros on the others), over the finite queries q, the
    levels k8 / v8 (rows along the last axis) and their scales; keys: the
    most keys a row sees.

    Q.K^T (against the reference on q itself; none on q8_query(q)): each
    query element is off by at most (1/2 + 2^-8) a / 32767, a = max|q_r|
    (the rounding to an integer, then the float32 quotient's and scale's
    roundings), plus u |q| (inside the float32 bounds); the int32 dot
    product is exact.  A logit moves by at most d = (1/2 + 2^-8) |scale|
    (a / 32767) max_j k_scale[j] sum_d |k8[j, d]|, the lse by d, each
    normalised weight by a factor within exp(+-2d), the output by
    (exp(2d) - 1) max|v|.
    P.V: the weights w_j = p_j v_scale[j] of a block of n_b <= min(keys, KC)
    keys are quantised to int16 with scale b = max_j |w_j|, each off by at
    most (1/2 + 2^-8) b / 32767, so the block's sum over its values moves
    by n_b (1/2 + 2^-8) (b / 32767) max|v8|.  With b <= max_{j in block} p_j
    max v_scale and the sum over blocks of max_{j in block} p_j <= l (the
    softmax's denominator), the output moves by at most min(keys, KC)
    (1/2 + 2^-8) / 32767 max|v|, max|v| = max v_scale max|v8|; plus 16 u
    max|v| for the conversions and scalings once per block.
    weights_typical: the weights' rounding errors are independent and
    uniform, so the block's sum has a standard deviation of at most
    sqrt(n_b / 3) (b / 65534) max|v8|: 4 sqrt(min(keys, KC)) (1/2 + 2^-8) /
    32767 max|v| is about 7 of them (a wrong pairing or a lost block is off
    by O(max|v|) instead)."""
    if isa not in Q8_DOT_ISAS:
        return 0.0, 0.0, 0.0, 0.0
    q = np.asarray(q, np.float64)
    a = float(np.abs(q[np.isfinite(q)]).max(initial=0.0))
    k8 = np.abs(np.asarray(k8, np.float64)).sum(-1) * np.asarray(k_scales, np.float64)
    vmax = (float(np.abs(np.asarray(v8, np.float64)).max(initial=0.0))
            * float(np.asarray(v_scales, np.float64).max(initial=0.0)))
    e = 0.5 + 2.0 ** -8
    d = e * abs(scale) * a / 32767 * float(k8.max(initial=0.0))
    n = min(keys, Q8_KC)
    weights = (n * e / 32767 + 16 * 2.0 ** -24) * vmax
    typical = (4 * np.sqrt(n) * e / 32767 + 16 * 2.0 ** -24) * vmax
    return (np.exp(2 * d) - 1) * vmax, d, weights, typical


def assert_close(actual, expected, dtype, magnitude=1.0, factor=1.0, err_msg=""):
    """Compare with a tolerance for ``dtype``, scaled by ``magnitude``.

    NaN positions must match exactly (assert_allclose's default equal_nan),
    and infinities must match exactly.
    """
    t = tol_for(dtype) * factor
    m = max(1.0, float(magnitude))
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64),
        np.asarray(expected, dtype=np.float64),
        rtol=t,
        atol=t * m,
        err_msg=err_msg,
    )


def expected_result_dtype(*arrays):
    """The documented output dtype of attention/softmax for these inputs."""
    dt = np.result_type(*arrays)
    if dt.kind in "biu":
        return np.dtype(np.float64)
    return dt


# ---------------------------------------------------------------------------
# reference, evaluated in float64 (an accurate "truth" for any input dtype)
# ---------------------------------------------------------------------------

def _f64(a):
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype == bool:
        return a
    return a.astype(np.float64)


# The float64 reference is most of the time of the tests parametrized over
# the ISA paths, and each path draws the same inputs (fixed seeds, a
# derandomized hypothesis), so a worker keeps the latest results by the
# inputs' contents: an ISA path after the first compares against the same
# numbers, computed once.
_MEMO: collections.OrderedDict[bytes, object] = collections.OrderedDict()
_MEMO_BYTES = [0]
_MEMO_LIMIT = 256 << 20


def _digest(h, x) -> bool:
    """Feed x's type and contents to h; False where x is not understood."""
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            return False
        h.update(f"a{x.dtype.str}{x.dtype.name}{x.shape}".encode())
        h.update(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
        return True
    if x is None or isinstance(x, (bool, int, float, str, np.generic)):
        h.update(f"s{type(x).__name__}:{x!r}".encode())
        return True
    if isinstance(x, (tuple, list)):
        h.update(f"{type(x).__name__}{len(x)}(".encode())
        ok = all(_digest(h, y) for y in x)
        h.update(b")")
        return ok
    if isinstance(x, dict):
        h.update(f"d{len(x)}(".encode())
        ok = all(_digest(h, k) and _digest(h, x[k]) for k in sorted(x))
        h.update(b")")
        return ok
    return False


def _copies(r):
    if isinstance(r, np.ndarray):
        return r.copy()
    return tuple(_copies(x) for x in r) if isinstance(r, tuple) else r


def _nbytes(r) -> int:
    if isinstance(r, np.ndarray):
        return r.nbytes
    return sum(_nbytes(x) for x in r) if isinstance(r, tuple) else 0


def memoized(fn):
    """fn, a pure function of arrays and plain values, with its latest results
    (256 MiB at most per process, none over 64 MiB) kept by the contents of
    its arguments; each call gets copies.  Arguments it cannot fingerprint
    are passed straight through to fn."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        h = hashlib.blake2b(f"{fn.__module__}.{fn.__qualname__}".encode())
        if not _digest(h, (args, kwargs)):
            return fn(*args, **kwargs)
        key = h.digest()
        if key in _MEMO:
            _MEMO.move_to_end(key)
            return _copies(_MEMO[key])
        r = fn(*args, **kwargs)
        size = _nbytes(r)
        if size > _MEMO_LIMIT // 4:  # a large result is not worth its copy
            return r
        _MEMO[key] = _copies(r)
        _MEMO_BYTES[0] += size
        while _MEMO_BYTES[0] > _MEMO_LIMIT:
            _MEMO_BYTES[0] -= _nbytes(_MEMO.popitem(last=False)[1])
        return r

    return call


reference_attention = memoized(reference.attention)


def reference_attention64(query, key, value, attn_mask=None, **kwargs):
    """fastattn.reference.attention on float64 copies of the inputs.

    Always returns (output, weights), both float64.
    """
    kwargs = dict(kwargs)
    kwargs.pop("out", None)
    kwargs.pop("num_threads", None)
    kwargs["return_weights"] = True
    return reference_attention(_f64(query), _f64(key), _f64(value), _f64(attn_mask), **kwargs)


def hidden_positions(L, S, batch, *, is_causal=False, attn_mask=None, key_padding_mask=None):
    """Boolean array batch+(L, S): True where a mask (not a score) hides (i, j)."""
    hidden = np.zeros(tuple(batch) + (L, S), dtype=bool)
    if is_causal:
        offset = S - L if is_causal == "lower_right" else 0
        hidden |= np.arange(S)[None, :] > np.arange(L)[:, None] + offset
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == bool:
            hidden |= ~m
        else:
            hidden |= m == -np.inf
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask, dtype=bool)
        if kpm.ndim == 2:
            kpm = kpm.reshape((kpm.shape[0],) + (1,) * (len(batch) - 1) + (1, S))
        hidden |= kpm
    return hidden


# ---------------------------------------------------------------------------
# memory layouts: same values, different strides
# ---------------------------------------------------------------------------

LAYOUTS = ("C", "F", "sliced", "negative", "permuted")


def _junk(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return 12345


def relayout(a, layout):
    """Return an array equal to ``a`` but with the memory layout ``layout``.

    C: C-contiguous; F: Fortran order; sliced: every other element of a larger
    buffer whose other elements are junk (NaN for floats); negative: every
    stride negative; permuted: leading axis moved last in memory (for 2-D:
    the transpose of a C-contiguous array).
    """
    a = np.asarray(a)
    if a.ndim == 0:
        return a.copy()
    if layout == "C":
        return np.ascontiguousarray(a)
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "sliced":
        big = np.full(tuple(2 * n + 1 for n in a.shape), _junk(a.dtype), dtype=a.dtype)
        sl = tuple(slice(1, 2 * n, 2) for n in a.shape)
        big[sl] = a
        view = big[sl]
        assert not view.flags.c_contiguous or a.size <= 1
        return view
    if layout == "negative":
        rev = (slice(None, None, -1),) * a.ndim
        return np.ascontiguousarray(a[rev])[rev]
    if layout == "permuted":
        b = np.ascontiguousarray(np.moveaxis(a, 0, -1))
        return np.moveaxis(b, -1, 0)
    raise ValueError(layout)


def empty_with_layout(shape, dtype, layout, fill):
    """A writable array of ``shape`` with ``layout``, filled with ``fill``.

    Returns (array, parent) where ``parent`` is the owning buffer, so a test
    can check that nothing outside the view was written.
    """
    base = np.full(shape, fill, dtype=dtype)
    if layout == "sliced":
        parent = np.full(tuple(2 * n + 1 for n in shape), fill, dtype=dtype)
        view = parent[tuple(slice(1, 2 * n, 2) for n in shape)]
        return view, parent
    view = relayout(base, layout)
    parent = view.base if view.base is not None else view
    return view, parent


def mentions_shape(msg: str, shape) -> bool:
    """True when ``msg`` shows ``shape`` in one of the usual spellings."""
    shape = tuple(int(n) for n in shape)
    forms = {
        str(shape),
        str(shape).replace(" ", ""),
        str(list(shape)),
        str(list(shape)).replace(" ", ""),
        "x".join(map(str, shape)),
        " x ".join(map(str, shape)),
        "×".join(map(str, shape)),
    }
    return any(f in msg for f in forms)


# ---------------------------------------------------------------------------
# attention against the reference: shared by the numerics/ and kernels/ files
# ---------------------------------------------------------------------------

CAUSAL = (False, True, "upper_left", "lower_right")


@pytest.fixture(params=FLOAT_DTYPES, ids=["float32", "float64"])
def dtype(request):
    """float32 and float64 (a test's own ``parametrize("dtype", ...)`` wins)."""
    return request.param


def _randn(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def check_against_reference(query, key, value, attn_mask=None, *, factor=1.0, **kwargs):
    """Run fastattn and the (float64) reference and compare everything.

    Checks: output dtype and shape, output values, weights values, that
    positions hidden by a mask get weight exactly 0, that rows with no visible
    key give exactly 0 output, and that ``out`` (if given) is returned and
    filled.
    """
    out = kwargs.get("out")
    return_weights = kwargs.pop("return_weights", True)
    exp_o, exp_w = reference_attention64(query, key, value, attn_mask, **kwargs)
    res = fastattn.attention(query, key, value, attn_mask, return_weights=return_weights, **kwargs)
    if return_weights:
        assert isinstance(res, tuple) and len(res) == 2
        got_o, got_w = res
    else:
        got_o, got_w = res, None
    dtype = expected_result_dtype(query, key, value)
    assert isinstance(got_o, np.ndarray)
    assert got_o.dtype == dtype, (got_o.dtype, dtype)
    assert got_o.shape == exp_o.shape, (got_o.shape, exp_o.shape)
    if out is not None:
        assert got_o is out
    mag = finite_absmax(value)
    assert_close(got_o, exp_o, dtype, magnitude=mag, factor=factor, err_msg="output")
    # rows that see no key are exactly zero, never NaN
    dead = np.all(exp_w == 0, axis=-1) & np.all(exp_o == 0, axis=-1)
    assert np.all(got_o[dead] == 0)
    if got_w is not None:
        assert got_w.dtype == dtype
        assert got_w.shape == exp_w.shape
        assert_close(got_w, exp_w, dtype, factor=factor, err_msg="weights")
        L, S = got_w.shape[-2:]
        hidden = hidden_positions(
            L, S, got_w.shape[:-2], is_causal=kwargs.get("is_causal", False),
            attn_mask=attn_mask, key_padding_mask=kwargs.get("key_padding_mask"))
        assert np.all(got_w[hidden] == 0), "a hidden position got a non-zero weight"
    return got_o, got_w


def _sub_batch(draw, batch):
    """Leading dims that broadcast to ``batch``: some dims 1, some dropped."""
    dims = [n if draw(st.booleans()) else 1 for n in batch]
    drop = draw(st.integers(0, len(dims)))
    return tuple(dims[drop:])


# ---------------------------------------------------------------------------
# multi-head attention
# ---------------------------------------------------------------------------

@pytest.fixture
def spy(monkeypatch):
    """Record every call multi_head_attention makes to fastattn.attention."""
    import fastattn._api as api

    real = api.attention
    calls = []

    def attention(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "attention", attention)
    return calls

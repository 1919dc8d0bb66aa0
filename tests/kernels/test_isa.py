"""ISA paths: what the machine offers, selecting one (and refusing what it
does not offer), the paths agreeing with each other, and the FMA peak probe
that runs the kernel of the ISA in use."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from conftest import _randn, assert_close, finite_absmax


def test_isa_api():
    isas = fastattn.available_isas()
    assert isinstance(isas, tuple) and "generic" in isas
    assert set(isas) <= {"generic", "avx2", "avx512", "avx512_bf16", "amx"}
    assert fastattn.get_isa() in isas
    assert isinstance(fastattn.openmp_enabled(), bool)


def test_set_isa_round_trip(isa):
    """set_isa to every available path and back (the fixture restores the
    path in use before the test)."""
    for name in fastattn.available_isas():
        fastattn.set_isa(name)
        assert fastattn.get_isa() == name
    fastattn.set_isa(isa)
    assert fastattn.get_isa() == isa


def test_isas_agree(rng):
    q, k, v = _randn(rng, (2, 70, 40), np.float32), _randn(rng, (2, 300, 40), np.float32), _randn(rng, (2, 300, 33), np.float32)
    prev = fastattn.get_isa()
    results = {}
    try:
        for name in fastattn.available_isas():
            fastattn.set_isa(name)
            results[name] = fastattn.attention(q, k, v, is_causal="lower_right", return_weights=True)
    finally:
        fastattn.set_isa(prev)
    base = results["generic"]
    for name, (o, w) in results.items():
        assert_close(o, base[0], np.float32, magnitude=finite_absmax(v), factor=2)
        assert_close(w, base[1], np.float32, factor=2)


@pytest.mark.parametrize("name", ["avx1024", "", "AVX2x", "neon"])
def test_set_isa_unknown(name):
    before = fastattn.get_isa()
    with pytest.raises(ValueError):
        fastattn.set_isa(name)
    assert fastattn.get_isa() == before


def test_set_isa_unsupported_on_this_cpu():
    before = fastattn.get_isa()
    for name in ("generic", "avx2", "avx512", "avx512_bf16", "amx"):
        if name not in fastattn.available_isas():
            with pytest.raises(ValueError):
                fastattn.set_isa(name)
            assert fastattn.get_isa() == before


# ---------------------------------------------------------------------------
# the FMA peak probe
# ---------------------------------------------------------------------------

# float32, float64 (the bfloat16 tiers run the avx512 kernels for these)
LANES = {"generic": (1, 1), "avx2": (8, 4), "avx512": (16, 8), "avx512_bf16": (16, 8), "amx": (16, 8)}


def test_fma_probe_counts_the_flops_of_the_isa_in_use(isa):
    """The benchmark's FMA peak probe (fastattn._core.fma_probe) runs the
    kernel of the ISA in use on a team of threads and counts its flops."""
    from fastattn import _core
    chains = 12                                   # FA_PROBE_CHAINS (blocking.h)
    for dtype, lanes in zip(("float32", "float64"), LANES[isa]):
        assert _core.fma_probe(dtype, 1000, 1) == 2 * lanes * chains * 1000
        assert _core.fma_probe(dtype, 0, 1) == 0
        team = 2 if _core.openmp_enabled() else 1
        assert _core.fma_probe(dtype, 10, 2) == team * 2 * lanes * chains * 10


@pytest.mark.parametrize("args", [("float16", 10, 1), ("float32", -1, 1)],
                         ids=["bad_dtype", "negative_n"])
def test_fma_probe_rejects_bad_arguments(args):
    from fastattn import _core
    with pytest.raises(ValueError, match="dtype|n must"):
        _core.fma_probe(*args)

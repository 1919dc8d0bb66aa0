"""ISA paths: what the machine offers, selecting one (and refusing what it
does not offer), the paths agreeing with the reference and with each other,
and the FMA peak probe that runs the kernel of the ISA in use.  The names
come from the library (fastattn._core.ISA_NAMES)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fastattn
from fastattn import _core
from conftest import _randn, assert_close, check_against_reference, finite_absmax, using_isa
from support import run_python

NAMES = _core.ISA_NAMES        # every path of the ISA list, lowest first


def test_isa_api():
    isas = fastattn.available_isas()
    assert isinstance(isas, tuple) and isas[0] == NAMES[0]     # the baseline path
    assert [n for n in NAMES if n in isas] == list(isas)         # in the list's order
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


def test_isas_agree_with_the_reference_and_each_other(rng):
    """Every path against the float64 reference, and against the baseline
    path (a machine with the baseline path alone checks that one)."""
    q, k, v = _randn(rng, (2, 70, 40), np.float32), _randn(rng, (2, 300, 40), np.float32), _randn(rng, (2, 300, 33), np.float32)
    results = {}
    for name in fastattn.available_isas():
        with using_isa(name):
            results[name] = check_against_reference(q, k, v, is_causal="lower_right", factor=2)
    base = results[NAMES[0]]
    for name, (o, w) in results.items():
        assert_close(o, base[0], np.float32, magnitude=finite_absmax(v), factor=2, err_msg=name)
        assert_close(w, base[1], np.float32, factor=2, err_msg=name)


# Names that are no ISA path of the list, by construction.
UNKNOWN = {"empty": "", "upper_case": NAMES[-1].upper(), "suffixed": NAMES[-1] + "x",
           "spaced": f" {NAMES[0]}", "joined": "+".join(NAMES)}


@pytest.mark.parametrize("name", list(UNKNOWN.values()), ids=list(UNKNOWN))
def test_set_isa_unknown(name):
    assert name not in NAMES
    before = fastattn.get_isa()
    with pytest.raises(ValueError, match="not available"):
        fastattn.set_isa(name)
    assert fastattn.get_isa() == before


_UNSUPPORTED = """
    import json
    import fastattn
    from fastattn import _core
    refused = {}
    for name in _core.ISA_NAMES[1:]:
        try:
            fastattn.set_isa(name)
        except ValueError as e:
            refused[name] = [str(e), fastattn.get_isa()]
    print(json.dumps({"available": fastattn.available_isas(), "isa": fastattn.get_isa(),
                      "refused": refused}))
"""


def test_set_isa_refuses_paths_the_cpu_lacks():
    """Every path above the baseline disabled, as on a CPU without their
    features (FASTATTN_DISABLE_CPU_FEATURES, in a fresh interpreter): the
    paths built but unsupported are not offered and set_isa refuses each
    with ValueError, leaving the baseline in use."""
    if len(NAMES) < 2:
        pytest.skip("this build has the baseline ISA path alone: nothing to refuse")
    res = run_python(_UNSUPPORTED, env={"FASTATTN_ISA": None,
                                        "FASTATTN_DISABLE_CPU_FEATURES": ",".join(NAMES[1:])})
    got = json.loads(res.stdout)
    assert got["available"] == [NAMES[0]] and got["isa"] == NAMES[0], got
    assert sorted(got["refused"]) == sorted(NAMES[1:]), got
    for name, (msg, isa) in got["refused"].items():
        assert repr(name) in msg and "not available" in msg and isa == NAMES[0], got


# ---------------------------------------------------------------------------
# the FMA peak probe
# ---------------------------------------------------------------------------

# Vector lanes per ISA path of the list: float32, float64 (the bfloat16
# tiers run the avx512 kernels for these).
LANES = {"generic": (1, 1), "avx2": (8, 4), "avx512": (16, 8), "avx512_bf16": (16, 8), "amx": (16, 8),
         "neon": (4, 2), "neon_bf16": (4, 2), "sve": (8, 4)}


def test_lanes_name_every_isa_path():
    assert set(LANES) == set(NAMES)


def test_fma_probe_counts_the_flops_of_the_isa_in_use(isa):
    """The benchmark's FMA peak probe (fastattn._core.fma_probe) runs the
    kernel of the ISA in use on a team of threads and counts its flops."""
    chains = 12                                   # FA_PROBE_CHAINS (blocking.h)
    for dtype, lanes in zip(("float32", "float64"), LANES[isa]):
        assert _core.fma_probe(dtype, 1000, 1) == 2 * lanes * chains * 1000
        assert _core.fma_probe(dtype, 0, 1) == 0
        team = 2 if _core.openmp_enabled() else 1
        assert _core.fma_probe(dtype, 10, 2) == team * 2 * lanes * chains * 10


@pytest.mark.parametrize("args", [("float16", 10, 1), ("float32", -1, 1)],
                         ids=["bad_dtype", "negative_n"])
def test_fma_probe_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match="dtype|n must"):
        _core.fma_probe(*args)

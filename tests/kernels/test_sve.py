"""What is particular to the sve tier (src_c/simd/simd_sve.h).

The tier is compiled for a 256-bit vector length and offered only where this
thread's SVE vector length is exactly that (runtime/cpu_aarch64.c sets
FA_CPU_ARM_SVE256): code built for 256 bits gives wrong results at any other
length.  Everywhere: the line is in the list, built for aarch64 only (not in
the SIMDe test build: SIMDe implements too little of SVE), and forcing it
where it is not offered is a clear error.  Where it runs (under qemu-aarch64
``-cpu max,sve256=on`` in .ci/aarch64.sh, or a Neoverse V1 / Graviton 3):
the default path, the vector exp, exp2 and tanh bitwise those of neon (the
same operation sequence of vmath_tmpl.h, fused alike: a check of every
primitive of the mapping), float16 and bfloat16 widened exactly and rounded
once.  The suite's ISA-parametrized tests run everything else on it.
"""

import numpy as np
import pytest

import fastattn
from conftest import using_isa
from fastattn import _config, _core
from support import run_python
from vmath_common import assert_vector_math_bitwise_equal, edges

SVE_HERE = "sve" in fastattn.available_isas()
needs_sve = pytest.mark.skipif(
    not SVE_HERE, reason="the sve tier is not available here (an aarch64 CPU with a "
                         "256-bit SVE vector length: Neoverse V1, or qemu -cpu max,sve256=on)")
DTYPES = [pytest.param(np.float32, id="float32"), pytest.param(np.float64, id="float64")]


def test_sve_is_a_line_built_for_aarch64_only():
    assert "sve" in _core.ISA_NAMES
    assert _core.ISA_NAMES.index("sve") > _core.ISA_NAMES.index("neon")
    built = "sve" in _config.built_isas()
    assert built == (_config.config()["arch"] == "aarch64")
    if _core.neon_emulated():
        assert not built and "neon" in _config.built_isas()


@pytest.mark.skipif(SVE_HERE, reason="the sve tier is available here: nothing refuses it")
def test_sve_forced_where_not_offered_is_a_clear_error():
    res = run_python("import fastattn", env={"FASTATTN_ISA": "sve"}, check=False)
    assert res.returncode != 0
    why = ("this CPU/OS does not support it" if "sve" in _config.built_isas()
           else "not built for this architecture")
    assert f"FASTATTN_ISA=sve: {why}" in res.stderr, res.stderr


@needs_sve
def test_sve_is_the_default_where_offered():
    """(Under qemu-user no child interpreter can start: .ci/aarch64.sh checks
    the default of each CPU model from outside.)"""
    names = _core.ISA_NAMES
    assert names.index(fastattn.get_isa()) >= names.index("sve")
    assert _core.cpu_supports("neon")


@needs_sve
@pytest.mark.parametrize("dtype", DTYPES)
def test_sve_exp_exp2_tanh_are_bitwise_neons_odd_length(dtype):
    """An odd length: the kernels' padded tail vector too."""
    assert_vector_math_bitwise_equal(edges(dtype, 5003), "neon", "sve")


@needs_sve
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("L", [3, 40], ids=["direct_decode", "packed"])
def test_sve_16_bit_storage_widened_exactly_and_rounded_once(dt, L):
    """16-bit Q, K, V give bitwise the float32 result of their widened values,
    rounded once to the 16-bit type (subnormals among the inputs); bfloat16
    where the CPU also offers neon_bf16: that tier's matrix path, bitwise."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = np.float16 if dt == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(5)
    info = ml_dtypes.finfo(t) if dt == "bfloat16" else np.finfo(t)

    def values(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        x.reshape(-1)[:3] = [float(info.smallest_subnormal), float(info.smallest_normal), 8.0]
        return x.astype(t)

    q, k, v = values((1, 2, L, 40)), values((1, 2, 77, 40)), values((1, 2, 77, 24))
    with using_isa("sve"):
        got = fastattn.attention(q, k, v)
        wide = fastattn.attention(q.astype(np.float32), k.astype(np.float32),
                                  v.astype(np.float32))
    assert got.dtype == np.dtype(t)
    if dt == "bfloat16" and L >= 16 and "neon_bf16" in fastattn.available_isas():
        # a CPU with FEAT_BF16: sve runs bfloat16 on neon_bf16's BFMMLA kernels
        # (the matrix path, P rounded to bfloat16), the very same functions
        with using_isa("neon_bf16"):
            assert got.tobytes() == fastattn.attention(q, k, v).tobytes()
        return
    assert got.tobytes() == wide.astype(t).tobytes()


@needs_sve
@pytest.mark.parametrize("dtype", DTYPES)
def test_sve_keys_not_a_multiple_of_the_tile_match_the_reference(dtype):
    """Key counts around the 32-key (float) / 16-key (double) register tile
    and the 128-key block: the zero-padded last panel."""
    from fastattn import reference
    rng = np.random.default_rng(3)
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for S in (1, 15, 17, 31, 33, 127, 129, 161):
        q = rng.standard_normal((2, 13, 72)).astype(dtype)
        k = rng.standard_normal((2, S, 72)).astype(dtype)
        v = rng.standard_normal((2, S, 40)).astype(dtype)
        with using_isa("sve"):
            got = fastattn.attention(q, k, v, is_causal="lower_right")
        want = reference.attention(q.astype(np.float64), k.astype(np.float64),
                                   v.astype(np.float64), is_causal="lower_right")
        assert np.max(np.abs(got - want)) < tol, S

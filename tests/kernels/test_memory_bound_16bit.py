"""The 16-bit matrix driver's memory is bounded by its blocks and threads: one
bfloat16 or float16 call of 16 queries against 32768 keys (8 heads, E = 64)
adds at most 16 MiB, on every ISA path the machine
has: K and V (32 MiB each) are packed a key block at a time, never copied
whole before the first block."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
from conftest import PROC_STATUS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self (Linux only)")
ml_dtypes = pytest.importorskip("ml_dtypes")

BOUND = 16 * 2**20

_SCRIPT = PROC_STATUS + textwrap.dedent("""
    import sys
    import ml_dtypes, numpy as np, fastattn

    dt = np.dtype(ml_dtypes.bfloat16) if sys.argv[1] == "bfloat16" else np.dtype(np.float16)
    fastattn.set_isa(sys.argv[2])
    H, L, S, E = int(sys.argv[3]), 16, 32768, 64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, L, E), dtype=np.float32).astype(dt)
    k, v = (rng.standard_normal((1, H, S, E), dtype=np.float32).astype(dt) for _ in "kv")
    out = np.full((1, H, L, E), np.nan, dt)           # touched: resident
    fastattn.attention(q[:, :, :, :], k[:, :, :64], v[:, :, :64], out=out)  # warm-up
    try:                                               # reset VmHWM to VmRSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base = status("VmRSS")
    fastattn.attention(q, k, v, out=out)
    peak = status("VmHWM")
    assert np.isfinite(out.astype(np.float32)).all()
    print("EXTRA", peak - base)
""")


def _extra(dt: str, isa: str, heads: int) -> int:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    res = subprocess.run([sys.executable, "-c", _SCRIPT, dt, isa, str(heads)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return int([ln for ln in res.stdout.splitlines() if ln.startswith("EXTRA")][0].split()[1])


@pytest.mark.parametrize("isa", fastattn.available_isas())
@pytest.mark.parametrize("dt", [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)],
                         ids=["bfloat16", "float16"])
def test_16bit_extra_memory_at_L16_against_32768_keys_within_16MiB(dt, isa):
    """(1, 8, 16, 64) queries against (1, 8, 32768, 64) keys and values: a
    packed copy of K and V would be 64 MiB."""
    extra = _extra(dt.name, isa, 8)
    assert extra <= BOUND, f"{dt} on {isa}: {extra / 2**20:.1f} MiB beyond the resident arrays"

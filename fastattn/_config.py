"""Run-time configuration: the ISA path in use, threads, how it was built."""

from __future__ import annotations

import math
import os
import platform
import sys
from typing import Any

from . import _core
from ._version import __version__

__all__ = ["get_isa", "set_isa", "available_isas", "built_isas", "openmp_enabled",
           "show_config"]


def _cgroup_cpu_limit() -> int | None:
    """CPUs allowed by the cgroup's CPU quota (v2 cpu.max or v1 cfs), if any."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        if quota_us > 0 and period_us > 0:
            return max(1, math.ceil(quota_us / period_us))
    except (OSError, ValueError):
        pass
    return None


def effective_cpu_count() -> int:
    """The CPUs this process may use: affinity mask and cgroup quota (as
    scikit-learn's ``_openmp_effective_n_threads``)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    return max(1, min(n, limit) if limit else n)


def _omp_threads_given() -> bool:
    """Does OMP_NUM_THREADS hold a count the OpenMP runtime takes: a positive
    int, or a comma list of them (one per nesting level)?  An invalid value
    ('0', '-1', 'abc', '1.5'), which the runtime warns about and ignores,
    counts as unset."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return first.isascii() and first.isdigit() and 0 < int(first) < 2**31


def init_threads() -> None:
    """At import: unless OMP_NUM_THREADS is set to a valid count, the OpenMP
    default becomes the CPUs this process may really use.  threadpoolctl and
    omp_set_num_threads still change it afterwards; num_threads=None reads
    it at each call."""
    if _omp_threads_given():
        return
    n = effective_cpu_count()
    if n < _core.openmp_max_threads():
        _core.set_default_threads(n)


def get_isa() -> str:
    """The SIMD path in use: one of the names of ``src_c/runtime/isa_list.h``
    for this architecture, e.g. ``'generic'``, ``'avx2'``, ``'avx512'``,
    ``'avx512_bf16'`` or ``'amx'`` on x86-64 (:func:`built_isas` lists them).

    Chosen at import as the best one the CPU and OS support, unless the
    environment variable ``FASTATTN_ISA`` names one.

    Examples
    --------
    >>> import fastattn
    >>> fastattn.get_isa() in fastattn.available_isas()
    True
    """
    return _core.get_isa()


def set_isa(name: str) -> None:
    """Switch every kernel to the path ``name`` (one of :func:`available_isas`).

    Meant for tests and benchmarks; not thread-safe against running calls.

    Examples
    --------
    >>> import fastattn
    >>> old = fastattn.get_isa()
    >>> fastattn.set_isa("generic"); fastattn.get_isa()
    'generic'
    >>> fastattn.set_isa(old)
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    _core.set_isa(name)


def available_isas() -> tuple[str, ...]:
    """The SIMD paths this CPU and OS can run, lowest first.

    Examples
    --------
    >>> import fastattn
    >>> fastattn.available_isas()[0]
    'generic'
    """
    return tuple(n for n in _core.ISA_NAMES if _core.cpu_supports(n))


def built_isas() -> tuple[str, ...]:
    """The SIMD paths compiled into this build, lowest first: the lines of
    ``src_c/runtime/isa_list.h`` of arch ``any`` and of the target's
    architecture (``config()["arch"]``).  :func:`available_isas` is the part
    of them this CPU and OS can run.

    Examples
    --------
    >>> import fastattn
    >>> from fastattn import _config
    >>> set(fastattn.available_isas()) <= set(_config.built_isas())
    True
    >>> _config.built_isas()[0]
    'generic'
    """
    return _core.BUILT_ISAS


def openmp_enabled() -> bool:
    """Whether the extension was built with OpenMP (else every call is serial).

    Examples
    --------
    >>> import fastattn
    >>> isinstance(fastattn.openmp_enabled(), bool)
    True
    """
    return _core.openmp_enabled()


def _build_config() -> dict[str, Any]:
    try:
        from . import _build_config as bc
    except ImportError:
        return {"compiler": "unknown", "cflags": "unknown", "isa_flags": {}, "arch": "unknown"}
    return {"compiler": bc.compiler, "cflags": bc.cflags, "isa_flags": bc.isa_flags,
            "arch": bc.arch}


def config() -> dict[str, Any]:
    """Everything :func:`show_config` prints, as a dict."""
    bc = _build_config()
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        # the target setup.py built for (normalised: x86_64, aarch64, ...)
        "arch": bc["arch"],
        "isa": get_isa(),
        "built_isas": list(built_isas()),
        "available_isas": list(available_isas()),
        # a SIMDe test build (setup.py): the avx512 path is emulated on AVX2
        "avx512_emulated": _core.avx512_emulated(),
        # a SIMDe test build (setup.py): the neon path compiled for x86-64
        "neon_emulated": _core.neon_emulated(),
        # float16 on the amx tier's tiles (AMX-FP16, or emulated); else F16C
        "amx_fp16": _core.amx_fp16(),
        "openmp": openmp_enabled(),
        "openmp_runtime": _core.openmp_runtime(),
        "threads": _core.openmp_max_threads(),
        "compiler": bc["compiler"],
        "cflags": bc["cflags"],
        "isa_flags": bc["isa_flags"],
    }


def show_config() -> None:
    """Print the version, ISA paths, OpenMP runtime, threads and build flags.

    Examples
    --------
    >>> import fastattn
    >>> fastattn.show_config()  # doctest: +ELLIPSIS
    fastattn ...
    """
    c = config()
    print(f"fastattn {c['version']} (Python {c['python']}, {c['machine']})")
    print(f"  arch            : {c['arch']}  (ISA paths built: {', '.join(c['built_isas'])})")
    print(f"  ISA path in use : {c['isa']}  (available: {', '.join(c['available_isas'])})")
    if c["avx512_emulated"]:
        print("  avx512          : EMULATED by SIMDe on AVX2 (a test build: slow, not for use)")
    if c["neon_emulated"]:
        print("  neon            : EMULATED by SIMDe on AVX2 (a test build: slow, not for use)")
    if "amx" in c["available_isas"]:
        print("  amx float16     : " + ("tiles (AMX-FP16)" if c["amx_fp16"] else
                                       "no AMX-FP16: float16 widened to float32 (F16C)"))
    print(f"  OpenMP          : {'yes' if c['openmp'] else 'no: serial build'}, {c['openmp_runtime']}")
    print(f"  threads         : {c['threads']}")
    print(f"  compiler        : {c['compiler']}")
    print(f"  flags           : {c['cflags']}")
    for f, fl in c["isa_flags"].items():
        print(f"  {f:<16}: {' '.join(fl) or '(no ISA flags: the baseline of the target)'}")

"""Run-time configuration: the ISA path in use, threads, how it was built."""

from __future__ import annotations

import platform
import sys

from . import _core

__all__ = ["get_isa", "set_isa", "available_isas", "openmp_enabled", "show_config"]


def get_isa() -> str:
    """The SIMD path in use: ``'avx512'``, ``'avx2'`` or ``'generic'``.

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


def openmp_enabled() -> bool:
    """Whether the extension was built with OpenMP (else every call is serial).

    Examples
    --------
    >>> import fastattn
    >>> isinstance(fastattn.openmp_enabled(), bool)
    True
    """
    return _core.openmp_enabled()


def _build_config() -> dict:
    try:
        from . import _build_config as bc
    except ImportError:
        return {"compiler": "unknown", "cflags": "unknown", "isa_flags": {}}
    return {"compiler": bc.compiler, "cflags": bc.cflags, "isa_flags": bc.isa_flags}


def config() -> dict:
    """Everything :func:`show_config` prints, as a dict."""
    from . import __version__
    bc = _build_config()
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "isa": get_isa(),
        "available_isas": list(available_isas()),
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
    print(f"  ISA path in use : {c['isa']}  (available: {', '.join(c['available_isas'])})")
    print(f"  OpenMP          : {'yes' if c['openmp'] else 'no: serial build'}, {c['openmp_runtime']}")
    print(f"  threads         : {c['threads']}")
    print(f"  compiler        : {c['compiler']}")
    print(f"  flags           : {c['cflags']}")
    for f, fl in c["isa_flags"].items():
        print(f"  {f:<16}: {' '.join(fl)}")

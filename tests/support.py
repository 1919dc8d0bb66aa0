"""Helpers of the suite that are not fixtures: Python in a fresh interpreter
(``run_python``) and the memory probes (``vm_rss``, ``vm_hwm``,
``peak_rss_delta``).

A plain module rather than part of conftest.py because it is also imported
where pytest is not: by the scripts ``run_python`` runs (it puts this folder
on their path, so a script can ``from support import peak_rss_delta``), and
by tests/test_packaging.py when CI runs that file as a script against an
installed wheel.  It imports nothing but the standard library and fastattn.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence

import fastattn

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# a fresh interpreter
# ---------------------------------------------------------------------------


def _child_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """os.environ with ``env`` applied (a value of None removes the variable),
    and PYTHONPATH led by the folder this process imported fastattn from (the
    checkout, or the sanitizer build of .ci/sanitize.sh), then this folder.
    An installed fastattn is found by the child's own site-packages."""
    e = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            e.pop(name, None)
        else:
            e[name] = value
    root = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    sites = set(site.getsitepackages()) | {site.getusersitepackages()}
    paths = [HERE] if root in sites else [root, HERE]
    if e.get("PYTHONPATH"):
        paths.append(e["PYTHONPATH"])
    e["PYTHONPATH"] = os.pathsep.join(paths)
    return e


def _tail(text: str | bytes | None, n: int = 4000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def run_python(code: str | None = None, *, module: str | None = None,
               argv: Sequence[str] = (), env: Mapping[str, str | None] | None = None,
               cwd: str | os.PathLike[str] | None = None, timeout: float = 120,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code argv...`` (or ``python -m module argv...``, or
    with neither ``python argv...``) in a fresh interpreter, the one running
    the suite, and return the finished process (text stdout and stderr).

    The child imports the same fastattn as this process, whichever the
    working directory: ``cwd`` defaults to a new empty folder, so that a
    checkout's ``fastattn/`` never shadows the build under test.  ``env``
    changes the inherited environment (None removes a variable).  A child
    that outlives ``timeout`` seconds (a deadlock) fails with what it had
    printed; with ``check``, so does a non-zero exit status.
    """
    args = [sys.executable]
    if code is not None:
        args += ["-c", textwrap.dedent(code)]
    elif module is not None:
        args += ["-m", module]
    args += [str(a) for a in argv]
    shown = " ".join(["-c", "<code>", *args[3:]] if code is not None else args[1:])
    with tempfile.TemporaryDirectory(prefix="fastattn-test-") as empty:
        try:
            res = subprocess.run(args, env=_child_env(env), cwd=cwd or empty, timeout=timeout,
                                 capture_output=True, text=True)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"python {shown} still ran after {timeout} s (a deadlock?)\n"
                                 f"--- stdout:\n{_tail(e.stdout)}\n--- stderr:\n{_tail(e.stderr)}"
                                 ) from None
    if check and res.returncode != 0:
        raise AssertionError(f"python {shown} exited {res.returncode}\n"
                             f"--- stdout:\n{_tail(res.stdout)}\n--- stderr:\n{_tail(res.stderr)}")
    return res


# ---------------------------------------------------------------------------
# memory probes (Linux: /proc/self)
# ---------------------------------------------------------------------------


def _proc_status(key: str) -> int:
    """A field of /proc/self/status, in bytes (its values are in kB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def vm_rss() -> int:
    """The resident memory of this process now, in bytes."""
    return _proc_status("VmRSS")


def vm_hwm() -> int:
    """The peak resident memory of this process, in bytes (since it started,
    or since the last reset by peak_rss_delta)."""
    return _proc_status("VmHWM")


def peak_rss_delta(fn: Callable[[], object]) -> int:
    """How far the resident memory rose above its level before ``fn()``
    while it ran, in bytes: the peak (VmHWM, reset to the current level first
    through /proc/self/clear_refs) less the resident memory at the start.
    Where the reset is refused the older peak counts too, so the answer can
    only be too large, never too small."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base = vm_rss()
    fn()
    return vm_hwm() - base

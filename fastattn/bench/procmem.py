"""A process's memory, read from Linux's /proc, for the sections that measure
a call's extra peak (memory, backward's score options, dask).  Self-contained,
so that a section's subprocess can take it as source (:func:`source`) without
importing fastattn: a peer's memory is then measured without fastattn loaded."""
import gc


def status() -> dict:
    """This process's peak (``VmHWM``) and resident (``VmRSS``) bytes."""
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                d[k] = int(v.split()[0]) * 1024
    return d


def reset_peak() -> bool:
    """Hand freed heap pages back to the OS (so that reusing them during the
    call counts as growth), then reset VmHWM to the current RSS; False where
    the kernel does not let it be reset."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def source() -> str:
    """This module's source, to run ahead of a subprocess's script."""
    with open(__file__, encoding="utf-8") as f:
        return f.read()


def available_bytes() -> int | None:
    """The memory available to a new allocation (MemAvailable), or None where
    /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None

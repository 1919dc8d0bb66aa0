"""fastattn's default thread count against the OMP_NUM_THREADS it finds at
import (fastattn._config.init_threads)."""

import pytest

from fastattn import _config


class _Runtime:
    """The two _core calls init_threads makes, recorded."""

    def __init__(self, default):
        self.default, self.set_to = default, None

    def openmp_max_threads(self):
        return self.default

    def set_default_threads(self, n):
        self.set_to = n


def _default_set(monkeypatch, value: str, runtime_default: int):
    """What init_threads sets the OpenMP default to (None: left alone) on a
    2-CPU process whose runtime would use runtime_default threads."""
    runtime = _Runtime(default=runtime_default)
    monkeypatch.setattr(_config, "_core", runtime)
    monkeypatch.setattr(_config, "effective_cpu_count", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    _config.init_threads()
    return runtime.set_to


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "", "99999999999999999999"])
def test_an_invalid_omp_num_threads_keeps_the_cpus_this_process_may_use(monkeypatch, value):
    # the OpenMP runtime warns and ignores it, defaulting to every CPU of the
    # host: fastattn took it as set and kept that, past the cgroup quota
    assert _default_set(monkeypatch, value, runtime_default=64) == 2


@pytest.mark.parametrize("value", ["8", "4,2", " 3"])
def test_a_valid_omp_num_threads_is_left_to_the_openmp_runtime(monkeypatch, value):
    assert _default_set(monkeypatch, value, runtime_default=8) is None

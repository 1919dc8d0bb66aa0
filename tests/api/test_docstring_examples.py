"""Every Examples section of the public modules runs and prints what it says."""

import doctest
import importlib

import pytest

MODULES = ["fastattn._api", "fastattn._softmax", "fastattn._config", "fastattn.mha",
           "fastattn.kvcache", "fastattn.merge", "fastattn.varlen", "fastattn.trace",
           "fastattn._trace_steps", "fastattn._trace_grad", "fastattn.backward",
           "fastattn.varlen_backward", "fastattn.paged", "fastattn.paged_cache"]


@pytest.mark.parametrize("name", MODULES)
def test_examples_of_module_run_as_written(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"

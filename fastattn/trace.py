"""The attention walkthrough, step by step, with the library's own kernels.

:func:`trace` returns every intermediate of one attention head (X, the
projections, Q, K, V, the raw and scaled scores, the mask, the softmax weights
and the output) for the walkthrough's 3-token, 2-dimension example or for
your own numbers; with the variants (soft-capping, ALiBi, a sliding window,
an attention sink) also their steps: the capped scores, the ALiBi bias and
the biased scores, the window in the mask, the sink's share of each row.
:func:`trace_backward` takes a trace on to the backward pass: dO, dV, dP,
D, dS, dQ and dK step by step.  ``python -m fastattn trace`` (:mod:`fastattn._trace_cli`) prints
those steps in the walkthrough's order so that it can be followed line by
line, including its drills::

    python -m fastattn trace                        # the worked example
    python -m fastattn trace --causal               # with the causal mask
    python -m fastattn trace --x "1,0;1,1;1,1"      # drill: token B = (1, 1)
    python -m fastattn trace --random 3,8 --scale 1 # drill: grow d_k, no scaling
    python -m fastattn trace --window 1,0 --alibi 0.5 --softcap 2 --sink 0
    python -m fastattn trace --grad                 # and the backward, step by step
    python -m fastattn trace --random 8,64 --scale 1 --grad   # saturation: gradients shrink
    python -m fastattn trace --json                 # machine-readable
    python -m fastattn trace --plot weights.png     # heatmap (needs matplotlib)

This module is the public face of four private ones: the steps
(:mod:`fastattn._trace_steps`), the backward's (:mod:`fastattn._trace_grad`),
the command line and the renderings.

Examples
--------
>>> from fastattn.trace import KEYS, main, trace
>>> tuple(trace()) == KEYS
True
>>> trace.main is main
True
"""

from ._trace_cli import main
from ._trace_grad import GRAD_KEYS, trace_backward
from ._trace_show import to_json
from ._trace_steps import KEYS, VARIANT_KEYS, WALKTHROUGH_X, trace

__all__ = ["trace", "trace_backward", "main", "to_json", "KEYS", "GRAD_KEYS", "VARIANT_KEYS",
           "WALKTHROUGH_X"]

# ``fastattn/__init__.py`` binds the name ``fastattn.trace`` to the function,
# so ``fastattn.trace.main(argv)`` and ``fastattn.trace.to_json`` must also
# work on the function.
trace.main = main  # type: ignore[attr-defined]
trace.to_json = to_json  # type: ignore[attr-defined]
trace.trace_backward = trace_backward  # type: ignore[attr-defined]

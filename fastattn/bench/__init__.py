"""The benchmark harness behind ``python -m fastattn bench``, shipped with
the package.

Times :func:`fastattn.attention` (and :func:`fastattn.softmax`) against
``torch.nn.functional.scaled_dot_product_attention`` (when torch is
installed) and the plain NumPy/SciPy composition, in one process:

* every implementation is warmed up first, then timed once per *round*, in an
  order that rotates from round to round (interleaved), and the median over
  the rounds is reported; rounds are added while the samples are spread (a
  disturbed spell of a shared machine); calls much shorter than a
  millisecond are timed as a loop of many calls per sample;
* every implementation runs under the same thread limit: ``num_threads=t``
  for fastattn, ``torch.set_num_threads(t)`` for torch and
  ``threadpoolctl.threadpool_limits(t)`` (BLAS *and* OpenMP) around all of
  them, set before each sample (outside the timed loop);
* a case's thread counts are timed in the same rounds (``fastattn@1``,
  ``torch@1``, ``fastattn@2``, ...), and the ratios (vs a peer, thread
  scaling) are medians of the per-round ratios, so that a slow spell of a
  shared machine does not land on one side of a ratio only;
* GFLOP/s counts ``4*B*H*L*S*D`` floating point operations per attention
  call (half of that for a causal square mask), and each fastattn figure is
  also given as a fraction of the float matmul peak (``np.matmul`` of two
  large square matrices, same dtype, same thread limit) measured in the
  same run; the machine's FMA peak (fastattn's register-only FMA probe) and
  its thread scaling are measured too, on their own and, as ``machine@t``,
  in the rounds of every case (the cores' scaling while that case ran);
* each optional peer or tool (torch, SciPy, threadpoolctl, matplotlib) is
  looked for once per run; a missing one is a note in the report's header,
  never an error.

The harness never touches ``OPENBLAS_*`` environment variables; see
``bench/README.md`` for how to run it so that NumPy's BLAS is not slowed.
The progress display goes to stderr, the result tables (markdown) to stdout.

Modules, one job each: :mod:`~fastattn.bench.cases` (sections, suites,
profiles, cases), :mod:`~fastattn.bench.timing` (interleaved rounds, medians,
paired ratios), :mod:`~fastattn.bench.peers` (discovery of the optional
modules, the peers' implementations), :mod:`~fastattn.bench.machine` (CPU,
thread pools, metadata, matmul and FMA peaks), :mod:`~fastattn.bench.memory`
(peak memory in subprocesses), :mod:`~fastattn.bench.runner` (the
measurements of a run, in order), :mod:`~fastattn.bench.report` (rows,
markdown tables, JSON), :mod:`~fastattn.bench.plot` (``--plot``),
:mod:`~fastattn.bench.progress` (stderr display) and
:mod:`~fastattn.bench.cli` (options and :func:`main`).
"""

from .cli import build_parser, main

__all__ = ["main", "build_parser"]

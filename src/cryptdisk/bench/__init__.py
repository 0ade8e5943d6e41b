"""The benchmark suite (``cryptdisk bench``): io, olap, oltp and crypto experiments.

What the command line uses: :class:`BenchOptions`, :class:`Cleanup` (scratch space,
children and mounts undone on exit), :func:`new_results` and :func:`run_experiment`,
:func:`progress_bar`, and the report (:func:`write_report`, :func:`summary_lines`).
Experiments are the modules named in ``EXPERIMENTS``; the rest is private.
"""

from ._cleanup import Cleanup
from ._model import BenchOptions, Failure, Measurement, Skipped
from ._progress import progress_bar
from ._report import summary_lines, write_report
from ._suite import EXPERIMENTS, Results, new_results, run_experiment

__all__ = [
    "EXPERIMENTS",
    "BenchOptions",
    "Cleanup",
    "Failure",
    "Measurement",
    "Results",
    "Skipped",
    "new_results",
    "progress_bar",
    "run_experiment",
    "summary_lines",
    "write_report",
]

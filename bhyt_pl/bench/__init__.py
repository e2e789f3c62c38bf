"""Benchmarks: ``python -m bhyt_pl bench`` (also ``python -m bhyt_pl.bench``); see docs/performance.md.

Modules: ``timing`` (interleaved repetitions, medians, paired ratios), ``sites`` (norm sites alone),
``prenorm`` (both pre-norm sites of a block), ``tanh`` (tanh formulations), ``models`` (ours and the
transformers peer), ``train_step``, ``generation``, ``decode`` (whole generate calls), ``memory`` (saved
activations), ``study_run`` (one study run, eager and compiled), ``report`` (ratios, tables), ``command``
(argument parsing and the run), ``gpu`` (the CUDA script); machine facts come from ``bhyt_pl.machine``.
What is timed is a
``bhyt_pl.variants.Variant``, the parser the study shares.
"""

from bhyt_pl.bench.command import main

__all__ = ["main"]

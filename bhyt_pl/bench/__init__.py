"""Benchmarks: ``python -m bhyt_pl bench`` (also ``python -m bhyt_pl.bench``); see docs/performance.md.

Modules: ``timing`` (interleaved repetitions, medians, machine facts), ``sites`` (norm sites alone),
``tanh`` (tanh formulations), ``models`` (ours and the transformers peer), ``train_step``, ``generation``,
``memory`` (saved activations), ``report`` (ratios, tables), ``command`` (argument parsing and the run),
``gpu`` (the CUDA script). What is timed is a
``bhyt_pl.variants.Variant``, the parser the study shares.
"""

from bhyt_pl.bench.command import main

__all__ = ["main"]

"""The stability study: ``python -m bhyt_pl study`` (also ``python -m bhyt_pl.study``); see docs/depth_study.md.

Modules: ``runner`` (one run: a Lightning fit with divergence detection, depth statistics and validation
loss on fixed batches along training), ``plan`` (the protocol: groups, selection, grid extension, matched
rates, run lists), ``metrics`` (per-run scalars from one snapshot: last-layer statistics, growth with depth),
``claims`` (the claims table and its evaluation), ``stats`` (intervals, rules, Holm), ``report`` (tables,
figures), ``command`` (argument parsing and the study loop)."""

from bhyt_pl.study.command import main

__all__ = ["main"]

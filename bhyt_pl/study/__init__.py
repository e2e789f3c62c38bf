"""The stability study: ``python -m bhyt_pl study`` (also ``python -m bhyt_pl.study``); see docs/depth_study.md.

Modules, lowest first: ``stats`` (intervals, rules, Holm); ``measure`` (what a run measures on its model: depth
statistics, trajectory points, layer importance), ``callbacks`` (a run's Lightning callbacks and in-memory logger)
and ``runner`` (one run: its spec, its result, its Lightning fit); ``design`` (the typed design: scheme groups,
selections, matched rates, runs by key); ``plan`` (the protocol's rules and run lists); ``launcher`` (the launcher
protocol), ``local`` (the process-pool and in-process launchers), ``scheduler`` (runs handed to a launcher, finished
runs reused) and ``protocol`` (the drivers: protocol v3, a fixed run list); ``metrics`` (per-run scalars from one
snapshot) and ``claims`` (the claims table and its evaluation); ``results`` (``results.json`` read and written);
``markdown`` (tables as column entries, numbers), ``tables``, ``figures`` and ``report`` (the document that puts
them together); ``data`` (the study's data); ``command`` (argument parsing and ``main``). The per-layer statistics
the study measures, summarises and shows are declared in ``bhyt_pl.callbacks.layer_stats``."""

from bhyt_pl.study.command import main

__all__ = ["main"]

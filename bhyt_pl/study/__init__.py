"""The stability study: ``python -m bhyt_pl study`` (also ``python -m bhyt_pl.study``); see docs/depth_study.md.

Modules, lowest first: ``stats`` (intervals, rules, Holm, one-sided tests, intersection-union tests, geometric
means) and ``power`` (the confirmation's power plan); ``measure`` (what a run measures on its model: depth
statistics, trajectory points, layer importance), ``callbacks`` (a run's Lightning callbacks and in-memory logger)
and ``runner`` (one run: its spec, its result, its Lightning fit); ``design`` (the typed design: scheme groups,
selections, matched rates, runs by key); ``plan`` (the protocol's rules, run lists and run labels); ``launcher``
(the launcher protocol), ``local`` (the process-pool and in-process launchers), ``scheduler`` (runs handed to a
launcher, finished runs reused) and ``protocol`` (the drivers: protocol v3, a fixed run list); ``metrics`` (per-run
scalars from one snapshot) and ``claims`` (the claims table, the confirmation's declared family, and their
evaluation); ``results`` (``results.json`` read and written, and the invocations that filled it); ``markdown``
(tables as column entries, numbers), ``tables``, ``figures`` and ``report`` (the document that puts them together);
``data`` (the study's data); ``arguments`` (the parser: one-line errors, no abbreviations) and ``command`` (argument
parsing and ``main``). The confirmation stage reads a finished study: ``confirm`` (the pilot, the candidates, the
frozen plan, its runs and verdicts), ``confirm_report`` (its document) and ``confirm_command`` (``python -m bhyt_pl
study confirm``). The per-layer statistics the study measures, summarises and shows are
declared in ``bhyt_pl.callbacks.layer_stats``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bhyt_pl.study import command, confirm_command

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bhyt_pl study [confirm] ...``: the confirmation stage when the first argument is ``confirm``
    (``bhyt_pl.study.confirm_command``, which reads a finished study, so it sits above the study's own command
    line), else the study (``bhyt_pl.study.command``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["confirm"]:
        return confirm_command.main(argv[1:])
    return command.main(argv)

"""The stability study: ``python -m bhyt_pl study`` (also ``python -m bhyt_pl.study``); see docs/depth_study.md.

The subpackages follow the pipeline, each importing only those before it:

- ``protocol``: what a study decides before and after its runs, without Lightning: the shared types
  (``spec``: ``RunSpec``, ``RunResult``, ``TrainerSettings``, run labels), the statistics (``stats``), the
  design and its rules (``design``, ``plan``), the claims (``claims``, ``metrics``) and the confirmation's
  power plan and evaluation (``power``, ``confirmation``).
- ``run``: one run, a Lightning fit with its measurements (``runner``, ``measure``, ``callbacks``, ``data``,
  ``preemption``).
- ``launch``: where runs execute (the ``Launcher`` protocol; the in-process, process-pool and submitit
  launchers) and the ``Scheduler`` that hands them out and reuses finished ones.
- ``record``: ``results.json``, the one versioned record every kind of study writes and reads back.
- ``report``: the documents and figures, rendered from a record alone.
- ``cli``: the driver every kind of study runs on, and the kinds themselves (the exploration, the confirmation).

Importing this package loads none of them: ``main`` imports the driver when called. It needs the ``study`` extra
(scipy for the statistics, submitit for the launchers): without it, importing any part of the study raises one line
naming the ``pip install`` to run (``bhyt_pl.optional``).
"""

from __future__ import annotations

from collections.abc import Sequence

from bhyt_pl.optional import require

__all__ = ["main"]

require("study")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bhyt_pl study [KIND] ...``: the driver (``bhyt_pl.study.cli.driver``) with its kinds."""
    from bhyt_pl.study.cli.driver import main as driver_main

    return driver_main(argv)

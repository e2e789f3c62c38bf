"""What a kind of study is to the driver: its options, its plan and its document.

The exploration (``python -m bhyt_pl study``) and the confirmation (``python -m bhyt_pl study confirm``) are two
kinds; a third is one subclass of ``StudyKind`` and one ``register_kind`` call. The driver
(``bhyt_pl.study.cli.driver``) owns everything they share: the launcher, the scheduler and reuse of finished
runs, Ctrl-C, ``--config``, ``--dry-run``, ``--report-from`` and the record written after every run.
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bhyt_pl.study.cli.arguments import StudyArgumentParser
from bhyt_pl.study.launch.options import add_launcher_arguments
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.run.data import Batch

__all__ = [
    "KINDS",
    "OnResult",
    "PreparedStudy",
    "StudyKind",
    "kind_for_command",
    "register_kind",
    "study_parser",
    "unregister_kind",
]

OnResult = Callable[[RunResult], None]


@dataclass
class PreparedStudy:
    """One invocation of a kind of study, decided before any run trains.

    Args:
        out: the study's folder.
        record: its record, without runs yet: kind, resolved setup, meta, and the design or plan.
        base_data_seed: the data seed of the fixed validation batches every run is measured on.
        execute: hands the study's runs to the scheduler as its plan decides them; calls ``on_result`` with each
            finished run and returns them all.
        final: whether the number of runs the scheduler was given is final (a plan that adds runs as results come
            in says so once it has them all).
        dry_run: prints what would run and what it costs for ``workers`` parallel runs, returns the exit code.
        stop: the exit code to return before any run (e.g. ``--plan-only``), or None to run.
        noun: how the log names it (``study``, ``confirmation``).
        on_start: called with the fixed validation batches before the first run (e.g. to record their unigram
            loss in ``meta``).
    """

    out: Path
    record: StudyRecord
    base_data_seed: int
    execute: Callable[[Scheduler, OnResult], list[RunResult]]
    final: Callable[[], bool] = lambda: True
    dry_run: Callable[[int], int] | None = None
    stop: int | None = None
    noun: str = "study"
    on_start: Callable[[list[Batch]], None] | None = None


class StudyKind(abc.ABC):
    """A kind of study: a plan (``prepare``) and a document (``render``, ``sections``) on the shared driver."""

    name: ClassVar[str]
    """The record's ``kind``."""
    command: ClassVar[str]
    """The word after ``python -m bhyt_pl study`` that selects it (``""``: the default kind)."""
    description: ClassVar[str] = ""
    epilog: ClassVar[str | None] = None
    dry_run_help: ClassVar[str] = "print what would run; train nothing, write nothing"
    """``--dry-run``'s help: what this kind's dry run prints."""

    @abc.abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The kind's own options (the driver adds ``--out``, ``--restart``, ``--config``, ``--dry-run``,
        ``--report-from``, ``--threads`` and the launcher's)."""

    @abc.abstractmethod
    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        """The study the parsed options (``values``, from the command line ``argv``) describe; a ``ValueError``
        naming the option when they are bad, before any work."""

    @abc.abstractmethod
    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        """The document (``out/report.md``) and, with ``figures``, its figures, from ``record`` alone."""

    def sections(self, record: StudyRecord) -> dict[str, object]:
        """The kind's evaluated sections written into ``results.json`` beside the runs (a reader's copy)."""
        return {}


KINDS: dict[str, StudyKind] = {}
"""Registered kinds by ``name``."""


def register_kind(kind: StudyKind) -> StudyKind:
    """Adds ``kind``; a name or command already taken is a ``ValueError``."""
    taken = [k.name for k in KINDS.values() if k.name == kind.name or k.command == kind.command]
    if taken:
        raise ValueError(f"study kind {kind.name!r} (command {kind.command!r}) clashes with {taken}")
    KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    KINDS.pop(name, None)


def kind_for_command(argv: Sequence[str]) -> tuple[StudyKind, list[str]]:
    """The kind ``argv``'s first word selects (the default kind when it names none), and the rest of ``argv``."""
    commands = {k.command: k for k in KINDS.values()}
    if argv and argv[0] in commands and argv[0]:
        return commands[argv[0]], list(argv[1:])
    if "" not in commands:
        raise ValueError(f"no default study kind; the kinds: {sorted(commands)}")
    return commands[""], list(argv)


def study_parser(kind: StudyKind) -> StudyArgumentParser:
    """``kind``'s options and the driver's; one-line errors, no abbreviations (``StudyArgumentParser``)."""
    command = f"python -m bhyt_pl study{' ' + kind.command if kind.command else ''}"
    p = StudyArgumentParser(
        prog=command,
        description=kind.description,
        epilog=kind.epilog,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    kind.add_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads with --workers 1 (default: torch's)")
    add_launcher_arguments(p)
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML file of options (names as the flags', e.g. lrs: [1.0e-3, 3.0e-3]); flags on the command line "
        "override it; see recipes/study/",
    )
    p.add_argument("--out", type=Path, default=None, help="the study's folder (each kind says its default)")
    p.add_argument("--restart", action="store_true", help="retrain every run (default: resume, reusing finished runs)")
    p.add_argument(
        "--report-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="rebuild DIR/report.md and its figures from DIR/results.json alone (any kind of study; no training, no "
        "run folders); every other option is ignored",
    )
    p.add_argument("--dry-run", action="store_true", help=kind.dry_run_help)
    return p

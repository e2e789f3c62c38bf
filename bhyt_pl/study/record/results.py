"""A study's record, ``results.json``: one versioned format for every kind of study, saved and loaded here only.

The document says which ``kind`` of study wrote it (``exploration``, ``confirmation``, or a kind registered later)
and its ``schema_version``, then holds:

- ``setup``: the study's resolved setup (its data, validation batches, trainer settings and claim roles), so a
  later stage reads what the study ran with, never a re-parse of its command line;
- ``meta``: how it ran (command, budget, machine, timing, the invocations that filled it); shown at the top of
  its report;
- the kind's payload: the exploration's ``design`` (None for a stability sweep), the confirmation's frozen
  ``plan``, the token-budget map's ``budgets``;
- the kind's evaluated sections as they stood when it was written (claims, verdicts: a reader's copy; loading
  evaluates them again from the runs);
- ``runs``: every run (each ``RunResult`` as a dict).

The driver rewrites it after every run, so an interrupted study keeps what it measured. A record written before
the format was versioned (no ``schema_version``) loads through ``bhyt_pl.study.record.upgrade``. Rendering reads
a record and writes only its document and figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bhyt_pl.strict_json import loads, write
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns
from bhyt_pl.study.protocol.power_plan import Plan
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.protocol.token_budget import BudgetDesign
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.record.upgrade import SCHEMA_VERSION, upgrade

__all__ = ["RESULTS_FILE", "SCHEMA_VERSION", "RecordedSetup", "StudyRecord", "load", "save"]

RESULTS_FILE = "results.json"


@dataclass
class StudyRecord:
    """What ``results.json`` holds, typed (module docstring).

    Args:
        kind: the kind of study that wrote it (``bhyt_pl.study.cli.kinds``).
        meta: how the study ran; shown at the top of its report.
        runs: every run, in the order of the report.
        setup: the resolved setup its runs shared (None: a kind without one, or a converted record whose setup
            could not be rebuilt).
        design: the exploration's design; None for a stability sweep and other kinds.
        plan: the confirmation's frozen plan; None for other kinds.
        budgets: the token-budget map's design; None for other kinds.
    """

    kind: str
    meta: dict[str, object]
    runs: list[RunResult] = field(default_factory=list)
    setup: RecordedSetup | None = None
    design: StudyDesign | None = None
    plan: Plan | None = None
    budgets: BudgetDesign | None = None

    @property
    def sweep(self) -> bool:
        """An exploration without a design: the stability sweep."""
        return self.kind == "exploration" and self.design is None

    def to_dict(self, sections: Mapping[str, object] | None = None) -> dict[str, object]:
        """The JSON document (module docstring); ``sections`` are the kind's evaluated sections, placed before
        the runs."""
        document: dict[str, object] = {
            "schema_version": SCHEMA_VERSION,
            "kind": self.kind,
            "setup": self.setup.to_dict() if self.setup is not None else None,
            "meta": self.meta,
        }
        if self.design is not None:
            document["design"] = self.design.to_dict()
        if self.plan is not None:
            document["plan"] = self.plan.to_dict()
        if self.budgets is not None:
            document["budgets"] = self.budgets.to_dict()
        document.update(sections or {})
        document["runs"] = [r.to_dict() for r in self.runs]
        return document

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyRecord:
        """The record of a document ``to_dict`` wrote, at this ``SCHEMA_VERSION`` (the evaluated sections are left
        out: they are evaluated again)."""
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {data.get('schema_version')!r}; this version reads {SCHEMA_VERSION} "
                "(older records load through bhyt_pl.study.record.upgrade)"
            )
        missing = [key for key in ("kind", "meta", "runs") if key not in data]
        if missing:
            raise ValueError(f"results.json has no {missing}: not a study's record (keys: {sorted(data)})")
        runs = [RunResult.from_dict(r) for r in data["runs"]]
        setup = RecordedSetup.from_dict(data["setup"]) if data.get("setup") else None
        design = StudyDesign.from_dict(data["design"], StudyRuns(runs)) if "design" in data else None
        plan = Plan.from_dict(data["plan"]) if "plan" in data else None
        budgets = BudgetDesign.from_dict(data["budgets"], runs) if "budgets" in data else None
        return cls(str(data["kind"]), dict(data["meta"]), runs, setup, design, plan, budgets)


def results_path(path: str | Path) -> Path:
    """``path`` itself, or the ``results.json`` inside it when it is a folder."""
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def load(path: str | Path) -> StudyRecord:
    """The record in ``path`` (``results.json`` or the study folder holding it), whatever its schema version:
    an older one is converted (``upgrade``), never rewritten."""
    path = results_path(path)
    try:
        data = loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the study's record {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a study's record (a JSON {type(data).__name__})")
    return StudyRecord.from_dict(upgrade(data))


def save(folder: Path, record: StudyRecord, sections: Mapping[str, object] | None = None) -> Path:
    """``folder/results.json``, written atomically (whole or absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESULTS_FILE
    write(path, record.to_dict(sections))
    return path

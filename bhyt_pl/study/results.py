"""A study's record, ``results.json``: what ran (``meta``), the design (depth study only), the claims as evaluated
when it was written, and every run (each ``RunResult`` as a dict).

The study rewrites it after every run, so an interrupted study keeps what it measured. ``load`` reads it back
into typed values: ``python -m bhyt_pl study --report-from DIR`` rebuilds the report from it alone, and a later
stage can start from a finished study's design and runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bhyt_pl.study.design import StudyDesign, StudyRuns
from bhyt_pl.study.runner import RunResult

__all__ = ["StudyRecord", "load"]

# a design written without its frame (the committed docs/depth_study/results.json): ``meta`` holds these fields
_FRAME_FROM_META = {"groups": "schemes", "lrs": "lrs", "seeds": "seeds", "extensions": "extensions"}


@dataclass
class StudyRecord:
    """What ``results.json`` holds, typed.

    Args:
        meta: how the study ran (command, budget, data, machine, timing); shown at the top of the report.
        runs: every run, in the order of the report.
        design: the depth study's design; None for a stability sweep.
    """

    meta: dict[str, Any]
    runs: list[RunResult]
    design: StudyDesign | None = None

    @property
    def sweep(self) -> bool:
        return self.design is None

    def to_dict(self, claims: Sequence[Mapping[str, Any]] = (), claims_not_tested: Sequence[str] = ()) -> dict:
        """The JSON document: ``meta``, then (depth study) ``design``, ``claims`` and ``claims_not_tested``, then
        ``runs``."""
        document: dict[str, Any] = {"meta": self.meta}
        if self.design is not None:
            document["design"] = self.design.to_dict()
            document["claims"] = list(claims)
            document["claims_not_tested"] = list(claims_not_tested)
        document["runs"] = [r.to_dict() for r in self.runs]
        return document

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyRecord:
        """The record of a document ``to_dict`` wrote (the claims are left out: they are evaluated again)."""
        for key in ("meta", "runs"):
            if key not in data:
                raise ValueError(f"results.json has no {key!r}: not a study's record (keys: {sorted(data)})")
        if "plan" in data:  # bhyt_pl.study.confirm's record: runs of a frozen plan, not a design or a sweep
            raise ValueError(
                "results.json is a confirmation's record; rebuild its report with "
                "python -m bhyt_pl study confirm --report-from DIR"
            )
        meta = dict(data["meta"])
        runs = [RunResult.from_dict(r) for r in data["runs"]]
        design = None
        if "design" in data:
            recorded = dict(data["design"])
            for field_name, meta_key in _FRAME_FROM_META.items():
                if field_name not in recorded and meta_key in meta:
                    recorded[field_name] = meta[meta_key]
            design = StudyDesign.from_dict(recorded, StudyRuns(runs))
        return cls(meta, runs, design)


def load(path: str | Path) -> StudyRecord:
    """The record in ``path`` (``results.json`` or the study folder holding it)."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the study's record {str(path)!r}: {exc}") from exc
    return StudyRecord.from_dict(data)

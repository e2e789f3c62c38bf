"""A study's record, ``results.json``: what ran (``meta``), the design (depth study only), the claims as evaluated
when it was written, and every run (each ``RunResult`` as a dict).

The study rewrites it after every run, so an interrupted study keeps what it measured. ``load`` reads it back
into typed values: ``python -m bhyt_pl study --report-from DIR`` rebuilds the report from it alone, and a later
stage can start from a finished study's design and runs.

A study folder is often filled by several invocations (one interrupted, the next resuming it). ``Invocation``
keeps the record's account of them in ``meta``: ``wall_seconds`` is the total over every invocation,
``invocations`` lists each one (start, wall seconds, how it ended), and ``partial`` says how many runs are in
while the study has not finished (running, or interrupted); a finished study's record has no ``partial``. A record
written before invocations were counted has neither list: it reads as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bhyt_pl.strict_json import loads
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns
from bhyt_pl.study.protocol.spec import RunResult

__all__ = ["Invocation", "StudyRecord", "load"]

log = logging.getLogger(__name__)

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
        if (
            "plan" in data
        ):  # bhyt_pl.study.cli.confirmation_plan's record: runs of a frozen plan, not a design or a sweep
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
        data = loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the study's record {str(path)!r}: {exc}") from exc
    return StudyRecord.from_dict(data)


@dataclass
class Invocation:
    """This invocation of a study (or of a confirmation) in its folder, after the earlier ones the folder's record
    lists: what it writes into the record's ``meta`` (module docstring).

    Args:
        earlier: the earlier invocations, as ``meta["invocations"]`` lists them (``resume`` reads them).
        started_at: when this one started (``time.time()``).

    Example:
        >>> meta = {}
        >>> Invocation([{"wall_seconds": 100.0, "outcome": "interrupted"}]).record(meta, done=3, planned=8)
        >>> meta["partial"]["runs_done"], len(meta["invocations"]), meta["wall_seconds"] >= 100.0
        (3, 2, True)
    """

    earlier: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self._clock = time.perf_counter()

    @classmethod
    def resume(cls, folder: Path, restart: bool = False) -> Invocation:
        """This invocation after those recorded in ``folder/results.json`` (none with ``restart``, which trains the
        study again from scratch, or when there is no readable record). An older record without the list counts as
        one invocation of its ``wall_seconds``; an invocation the record shows still running stopped without saying
        how (its driver was killed)."""
        path = Path(folder) / "results.json"
        if restart or not path.is_file():
            return cls()
        try:
            meta = loads(path.read_text()).get("meta") or {}
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s cannot be read (%s); the wall time of earlier invocations is not carried over", path, exc)
            return cls()
        earlier = [dict(item) for item in meta.get("invocations") or []]
        if not earlier and isinstance(meta.get("wall_seconds"), int | float):
            earlier = [{"wall_seconds": meta["wall_seconds"]}]
        for item in earlier:
            if item.get("outcome") == "running":
                item["outcome"] = "stopped"
        return cls(earlier)

    @property
    def seconds(self) -> float:
        """Wall seconds since this invocation started."""
        return time.perf_counter() - self._clock

    def record(
        self, meta: dict[str, Any], done: int, planned: int, final: bool = True, outcome: str = "running"
    ) -> None:
        """Writes the account into ``meta``: the total ``wall_seconds``, ``invocations`` with this one (``outcome``:
        ``running``, ``interrupted`` or ``finished``), and, unless ``finished``, ``partial``: ``done`` of ``planned``
        runs (``final`` False: the protocol may still add runs)."""
        this = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at)),
            "wall_seconds": round(self.seconds, 1),
            "outcome": outcome,
        }
        earlier = sum(float(item.get("wall_seconds") or 0.0) for item in self.earlier)
        meta["wall_seconds"] = round(earlier + self.seconds, 1)
        meta["invocations"] = [*self.earlier, this]
        if outcome == "finished":
            meta.pop("partial", None)
        else:
            meta["partial"] = {"runs_done": done, "runs_planned": planned, "planned_final": final, "state": outcome}

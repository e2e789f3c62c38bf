"""How many invocations filled a study folder, and for how long: the account a record's ``meta`` keeps.

A study folder is often filled by several invocations (one interrupted, the next resuming it). ``Invocation``
keeps the record's account of them in ``meta``: ``wall_seconds`` is the total over every invocation,
``invocations`` lists each one (start, wall seconds, how it ended), and ``partial`` says how many runs are in
while the study has not finished (running, or interrupted); a finished study's record has no ``partial``. A record
written before invocations were counted has neither list: it reads as before.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from bhyt_pl.study.record.results import RESULTS_FILE, load

__all__ = ["Invocation"]

log = logging.getLogger(__name__)


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

    earlier: list[dict[str, object]] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self._clock = time.perf_counter()

    @classmethod
    def resume(cls, folder: Path, restart: bool = False) -> Invocation:
        """This invocation after those recorded in ``folder/results.json`` (none with ``restart``, which trains the
        study again from scratch, or when there is no readable record). An older record without the list counts as
        one invocation of its ``wall_seconds``; an invocation the record shows still running stopped without saying
        how (its driver was killed)."""
        path = Path(folder) / RESULTS_FILE
        if restart or not path.is_file():
            return cls()
        try:
            meta = load(path).meta
        except ValueError as exc:
            log.warning("%s cannot be read (%s); the wall time of earlier invocations is not carried over", path, exc)
            return cls()
        listed = meta.get("invocations")
        earlier = [dict(item) for item in listed if isinstance(item, dict)] if isinstance(listed, list) else []
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
        self, meta: dict[str, object], done: int, planned: int, final: bool = True, outcome: str = "running"
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

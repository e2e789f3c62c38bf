"""How a study's runs get trained: the launcher interface the study's ``Scheduler`` drives.

A launcher starts runs and later reports each one as queued, running, done (with its ``RunResult``) or
failed. The protocol (which runs to train, in what order, what to do with a result) never knows which
launcher trains them: a local process pool, this process itself, or a cluster's job queue whose jobs are
not ``concurrent.futures.Future`` objects and may outlive the driver that submitted them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = ["Launcher", "RunEvent", "RunState"]


class RunState(enum.Enum):
    """Where a started run is. ``DONE`` and ``FAILED`` are final for one try of a run."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class RunEvent:
    """One change of a run's state.

    Args:
        spec: the run.
        state: its new state.
        result: the run's result when ``state`` is ``DONE`` (its own ``status`` may still be ``"error"``: a run
            that trained and recorded its failure).
        error: why, when ``state`` is ``FAILED`` (a crashed worker, a cancelled or lost job).
    """

    spec: RunSpec
    state: RunState
    result: RunResult | None = None
    error: str | None = None


@runtime_checkable
class Launcher(Protocol):
    """Anything that starts runs and later reports them.

    ``start`` may batch its specs (one job array for a cluster); ``poll`` returns the state changes since the
    previous call, waiting up to ``timeout`` seconds for at least one (``None``: until there is one), and an
    empty list when nothing changed in that time. A run started once is reported ``DONE`` or ``FAILED``
    exactly once per start. ``close`` releases what the launcher holds: a local pool stops its workers, a
    cluster launcher leaves its queued jobs to a later driver.
    """

    def start(self, specs: Sequence[RunSpec]) -> None: ...

    def poll(self, timeout: float | None = None) -> list[RunEvent]: ...

    def close(self) -> None: ...

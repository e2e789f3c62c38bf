"""The study's scheduler: hands runs to a launcher (``bhyt_pl.study.launch.launcher.Launcher``), reads back the ones a
previous invocation finished, and yields results as they finish, whichever launcher trains them."""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

from bhyt_pl.strict_json import loads
from bhyt_pl.study.launch.launcher import Launcher, RunState
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, RunStatus, run_dirname

__all__ = ["Scheduler", "finished_result", "progress_line"]

log = logging.getLogger(__name__)


def finished_result(out: Path, spec: RunSpec) -> RunResult | None:
    """The run's stored result when it finished (ok or diverged) with exactly this spec, else None (resume). A
    record that exists but is not reused is named in the log with the reason: the run is trained again."""
    path = out / "runs" / run_dirname(spec.label) / "result.json"
    if not path.exists():
        return None
    try:
        stored = loads(path.read_text())
        if stored.get("status") not in (RunStatus.OK, RunStatus.DIVERGED):
            log.info("study run %s: trained again, its last try ended with %s", spec.label, stored.get("status"))
            return None
        expected = loads(json.dumps(asdict(spec), default=str))
        if stored["spec"] != expected:
            changed = sorted(
                k for k in expected.keys() | stored["spec"].keys() if stored["spec"].get(k) != expected.get(k)
            )
            log.warning(
                "study run %s: trained again, %s was made with other settings (%s differ)",
                spec.label,
                path,
                ", ".join(changed),
            )
            return None
        return RunResult.from_dict(stored)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(
            "study run %s: trained again, %s cannot be read (%s: %s)", spec.label, path, type(exc).__name__, exc
        )
        return None


class Scheduler:
    """Starts runs on a launcher, reusing finished ones (resume), and hands results back as they finish. A run whose
    label was submitted before is not submitted again (the two arms of the protocol share runs).

    Args:
        launcher: what trains the runs (``InlineLauncher``, ``ProcessPoolLauncher``, a cluster's).
        out: the study folder; a run's stored result is ``out/runs/<label>/result.json``.
        resume: read back runs that finished with the same spec instead of training them again.
        on_change: called with ``counts()`` whenever a run the launcher trains changes state (queued, running,
            done, failed): a cluster's driver shows its progress while no run finishes for a long time.
    """

    def __init__(
        self,
        launcher: Launcher,
        out: Path,
        resume: bool,
        on_change: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        if not isinstance(launcher, Launcher):
            raise TypeError(f"launcher must implement start, poll and close (Launcher), got {type(launcher).__name__}")
        self.launcher, self.out, self.resume, self.on_change = launcher, out, resume, on_change
        self.pending: dict[str, RunSpec] = {}  # submitted and not yet handed back, by label in submission order
        self.states: dict[str, RunState] = {}  # the last state the launcher reported for each run it trains
        self.reused: list[str] = []
        self.labels: set[str] = set()  # runs handed to this scheduler so far, reused ones included
        self._ready: deque[RunResult] = deque()

    @property
    def submitted(self) -> int:
        return len(self.labels)

    @property
    def failed(self) -> list[str]:
        """The runs the launcher reported failed (their tries spent), in the order it did."""
        return [label for label, state in self.states.items() if state is RunState.FAILED]

    def counts(self) -> dict[str, int]:
        """How many submitted runs are queued, running, done (reused ones included) and failed now. A run whose
        result says ``status: "error"`` is failed, whatever the launcher reported."""
        counts = dict.fromkeys(("queued", "running", "done", "failed"), 0)
        counts["done"] = len(self.reused)
        for state in self.states.values():
            counts[_COUNTED[state]] += 1
        return counts

    def submit(self, specs: Iterable[RunSpec]) -> list[RunSpec]:
        """Submits the specs not submitted before and returns them; the ones to train start on the launcher."""
        fresh, to_start = [], []
        for spec in specs:
            if spec.label in self.labels:
                continue
            self.labels.add(spec.label)
            self.pending[spec.label] = spec
            fresh.append(spec)
            stored = finished_result(self.out, spec) if self.resume else None
            if stored is not None:
                self.reused.append(spec.label)
                self._ready.append(stored)
            else:
                log.info("study run: %s", spec.label)
                self.states[spec.label] = RunState.QUEUED
                to_start.append(spec)
        if to_start:
            self.launcher.start(to_start)
        return fresh

    def finished(self) -> Iterator[RunResult]:
        """Yields results until nothing is pending (callers may submit more while iterating): reused runs first,
        then each run as the launcher reports it done or failed (a failed run is a result with status ``error``)."""
        while self.pending:
            if self._ready:
                result = self._ready.popleft()
                del self.pending[result.spec.label]
                yield result
                continue
            events = self.launcher.poll(timeout=None)
            if not events:  # a blocking poll that returns nothing: the launcher has lost the pending runs
                raise RuntimeError(
                    f"the launcher reported no change while {len(self.pending)} run(s) are pending "
                    f"({', '.join(list(self.pending)[:3])}, ...): were they started on it?"
                )
            for event in events:
                label = event.spec.label
                if label not in self.pending or label in (r.spec.label for r in self._ready):
                    log.warning("study: the launcher reported run %s (%s), which is not pending", label, event.state)
                    continue
                self.states[label] = event.state
                if event.state is RunState.DONE and event.result is not None:
                    if event.result.status == RunStatus.ERROR:
                        self.states[label] = RunState.FAILED
                    self._ready.append(event.result)
                elif event.state in (RunState.DONE, RunState.FAILED):
                    self.states[label] = RunState.FAILED
                    error = event.error or "the launcher reported it done without a result"
                    self._ready.append(RunResult(spec=self.pending[label], status=RunStatus.ERROR, error=error))
            if self.on_change is not None:
                self.on_change(self.counts())


_COUNTED = {RunState.QUEUED: "queued", RunState.RUNNING: "running", RunState.DONE: "done", RunState.FAILED: "failed"}


def progress_line(
    done: int,
    total: int,
    elapsed: float,
    reused: int = 0,
    final: bool = True,
    counts: dict[str, int] | None = None,
) -> str:
    """``run k of N`` and the time left, from this invocation's pace (runs reused from a previous one take
    no time, so they are left out of the pace). ``final=False`` while the protocol may still add runs (grid
    extensions, the matched arm): ``N`` and the time left are then lower bounds and say so. ``counts``
    (``Scheduler.counts``) adds how many runs are running, queued and failed."""
    line = f"study: run {done} of {'' if final else 'at least '}{total} done"
    if counts is not None:
        line += f" ({counts['running']} running, {counts['queued']} queued, {counts['failed']} failed)"
    fresh = done - reused
    if done < total and fresh > 0:
        left = elapsed / fresh * (total - done)
        line += f"; about {left / 60:.1f} min left" if left >= 60 else f"; about {left:.0f} s left"
        line += "" if final else " (at least)"
    return line

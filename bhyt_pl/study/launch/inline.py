"""The launcher that trains a study's runs in this process (``--workers 1``): ``InlineLauncher``.

Each run trains in the driver's own process, one per ``poll``: nothing is pickled, and a monkeypatched function or a
debugger sees the run. A run that raised is ``FAILED`` with the exception's text; a run that trained and recorded its
own failure (``RunResult.status == "error"``) is ``DONE``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from bhyt_pl.study.launch.launcher import RunEvent, RunState
from bhyt_pl.study.launch.pool import RunFunction, failure_text
from bhyt_pl.study.protocol.spec import RunSpec

__all__ = ["InlineLauncher"]


class InlineLauncher:
    """Trains the started runs in this process, in start order, one per ``poll`` call.

    Args:
        run: trains one run (``functools.partial(run_one, ...)``).

    Example:
        >>> from bhyt_pl.study.run.runner import RunResult, RunSpec
        >>> launcher = InlineLauncher(lambda spec: RunResult(spec))
        >>> launcher.start([RunSpec(label="a", norm="rmsnorm")])
        >>> [(e.spec.label, e.state.value) for e in launcher.poll()]
        [('a', 'done')]
    """

    def __init__(self, run: RunFunction) -> None:
        self.run = run
        self._queue: deque[RunSpec] = deque()

    def start(self, specs: Sequence[RunSpec]) -> None:
        self._queue.extend(specs)

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        """Trains the next queued run and reports it (however long it takes: ``timeout`` cannot cut a run short
        in this process); an empty list when nothing is queued."""
        if not self._queue:
            return []
        spec = self._queue.popleft()
        try:
            return [RunEvent(spec, RunState.DONE, result=self.run(spec))]
        except Exception as exc:  # noqa: BLE001 - a run that raised is one failed run, not the end of the study
            return [RunEvent(spec, RunState.FAILED, error=failure_text(exc))]

    def close(self) -> None:
        self._queue.clear()

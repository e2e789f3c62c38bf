"""The two launchers that train a study's runs on this machine (``bhyt_pl.study.launcher.Launcher``):

- ``InlineLauncher`` (``--workers 1``): each run in this process, one per ``poll``: nothing is pickled, and a
  monkeypatched function or a debugger sees the run;
- ``ProcessPoolLauncher`` (``--workers N``): N spawned worker processes with one torch thread each, so N runs
  share the cores without oversubscribing them.

Both report a run that raised as ``FAILED`` with the exception's text; a run that trained and recorded its own
failure (``RunResult.status == "error"``) is ``DONE``.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

import torch

from bhyt_pl.study.launcher import RunEvent, RunState
from bhyt_pl.study.runner import RunResult, RunSpec

__all__ = ["InlineLauncher", "ProcessPoolLauncher"]

RunFunction = Callable[[RunSpec], RunResult]


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InlineLauncher:
    """Trains the started runs in this process, in start order, one per ``poll`` call.

    Args:
        run: trains one run (``functools.partial(run_one, ...)``).

    Example:
        >>> from bhyt_pl.study.runner import RunResult, RunSpec
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
            return [RunEvent(spec, RunState.FAILED, error=_failure(exc))]

    def close(self) -> None:
        self._queue.clear()


def _init_worker() -> None:
    torch.set_num_threads(1)  # one thread per process: the workers share the cores without oversubscription
    logging.basicConfig(level=logging.WARNING, format="%(message)s")


class ProcessPoolLauncher:
    """Trains the started runs in ``workers`` spawned processes (``concurrent.futures.ProcessPoolExecutor``), one
    torch thread each; ``poll`` reports the runs that started or finished, in start order.

    Args:
        run: trains one run; it and every ``RunSpec`` are pickled to the workers, so it must be importable
            (a module-level function or a ``functools.partial`` of one).
        workers: processes.

    Fresh interpreters (``spawn``) rather than forks: a fork would copy this process's torch thread pools.
    """

    def __init__(self, run: RunFunction, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.run = run
        self._executor = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
        )
        self._futures: dict[Future, RunSpec] = {}  # in start order
        self._running: set[Future] = set()

    def start(self, specs: Sequence[RunSpec]) -> None:
        for spec in specs:
            self._futures[self._executor.submit(self.run, spec)] = spec

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        if not self._futures:
            return []
        done, _ = wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        events = []
        for future, spec in list(self._futures.items()):
            if future in done:
                del self._futures[future]
                self._running.discard(future)
                try:
                    events.append(RunEvent(spec, RunState.DONE, result=future.result()))
                except Exception as exc:  # noqa: BLE001 - a crashed worker is one failed run
                    events.append(RunEvent(spec, RunState.FAILED, error=_failure(exc)))
            elif future not in self._running and future.running():
                self._running.add(future)
                events.append(RunEvent(spec, RunState.RUNNING))
        return events

    def close(self) -> None:
        """Stops the workers; runs not yet started are cancelled (after an interrupt nothing new starts)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()

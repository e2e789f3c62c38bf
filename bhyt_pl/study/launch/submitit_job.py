"""Inside a submitit job: the callable every job of the study runs (``CheckpointableRun``), checkpointable.

``CheckpointableRun`` sets torch's threads to the job's CPUs and makes the run checkpointable: submitit's
preemption and timeout signal (``USR2``; Lightning's own requeue signal is ``USR1``) sets
``preemption_requested()``; the run saves its state at the end of its current step and raises ``RunPreempted``;
submitit then requeues the same job with the same spec, and the run resumes from what it saved. A run that does
not stop within half of ``signal_delay_s`` is requeued by submitit where it is. SIGTERM (SLURM's preemption signal
on a cluster without ``PreemptParameters=send_user_signal``, and its cancellation signal) makes the run save the
same way, then the job exits without requeueing itself (``_StopRequest``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import submitit
import torch
from submitit.core.utils import DelayedSubmission

from bhyt_pl.study.run.preemption import _PREEMPTED, RunPreempted  # the run reads the flag too

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = ["TERMINATED_EXIT_CODE", "CheckpointableRun", "SignalHandler"]

SignalHandler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None
"""What ``signal.getsignal`` returns: a Python handler, ``SIG_DFL``/``SIG_IGN``, or None (set outside Python)."""

log = logging.getLogger(__name__)


def _preemption_signal() -> signal.Signals:
    # submitit's signal: USR2 unless SUBMITIT_PREEMPT_SIGNAL names another
    return signal.Signals["SIG" + submitit.JobEnvironment.USR_SIG]


TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
"""A job's exit status after it saved its run on SIGTERM: a shell's status for a process ended by SIGTERM."""


def _remove_folder_template() -> None:
    """Removes the literal ``jobs/%j`` folder submitit's local job controller makes each time it starts a job's task
    (it creates its folder template as is; every file goes to ``jobs/<job id>/``, so the folder stays empty)."""
    folder = os.environ.get("SUBMITIT_FOLDER")  # the executor's folder template, as the job was given it
    if folder and "%" in Path(folder).name:
        with contextlib.suppress(OSError):  # absent already, or (not ours) not empty
            Path(folder).rmdir()


class _StopRequest:
    """The stop signals a job's run got, and how the job ends once the run has stopped (``hand_over``).

    - The preemption or timeout signal (``USR2``): submitit's handler, which checkpoints, requeues the job and exits.
    - ``SIGTERM`` alone: the job exits (``TERMINATED_EXIT_CODE``) without requeueing itself. SLURM sends SIGTERM,
      then SIGKILL after its grace time, to preempt a job (unless the cluster sets
      ``PreemptParameters=send_user_signal``) and to cancel one (``scancel``, the driver's ``cancel``): a preempted
      job comes back by SLURM's own requeue (``PreemptMode=REQUEUE``) or as the launcher's next try, and resumes from
      the run's save either way, while a cancelled job stays cancelled (``scontrol requeue`` would revive it).
      submitit itself logs SIGTERM and carries on ("Bypassing signal SIGTERM"), so the run would lose every step
      since its start at the SIGKILL.
    """

    def __init__(self, preemption: signal.Signals, handlers: dict[signal.Signals, SignalHandler]) -> None:
        self.preemption, self.handlers = preemption, handlers
        self.signals: list[signal.Signals] = []
        self.handed_over = False
        self._timers: list[threading.Timer] = []

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    def on_signal(self, sig: int, frame: FrameType | None, grace_s: float) -> None:
        """The first stop signal asks the run to save at its step's end; the same signal again (the run did not
        stop within ``grace_s``: the timer resends it) hands over at once, wherever the run is."""
        received = signal.Signals(sig)
        if received in self.signals:
            self.hand_over(frame)
            return
        self.signals.append(received)
        _PREEMPTED.set()
        log.warning("signal %s: the run saves at the end of its step, then the job %s", received.name,
                    "is requeued" if received == self.preemption else "exits")  # fmt: skip
        timer = threading.Timer(grace_s, signal.pthread_kill, (threading.main_thread().ident, sig))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def hand_over(self, frame: FrameType | None = None) -> None:
        """Ends the job the way its signals ask (class docstring): raises ``SystemExit`` (submitit's after a
        requeue, or ``TERMINATED_EXIT_CODE``), unless submitit's handler returns (a task of rank > 0)."""
        self.cancel_timers()
        self.handed_over = True
        if self.preemption in self.signals:
            handler = self.handlers[self.preemption]
            assert callable(handler)  # _deferred_stop replaces only a Python handler
            handler(self.preemption, frame)  # submitit: checkpoint, requeue, exit
            return
        log.warning("SIGTERM: the job exits without requeueing itself; the run resumes from its save when the job "
                    "runs again (SLURM's requeue or the study's next try)")  # fmt: skip
        raise SystemExit(TERMINATED_EXIT_CODE)

    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()


@contextlib.contextmanager
def _deferred_stop(grace_s: float) -> Iterator[_StopRequest | None]:
    """Defers the job's stop signals (submitit's preemption signal and SIGTERM) while the run reaches the end of a
    step.

    submitit's handler checkpoints and requeues wherever the preemption signal lands, possibly mid-step, and it
    ignores SIGTERM. Here the first signal only sets ``preemption_requested()``; the run saves and raises
    ``RunPreempted``, and the job ends through the yielded request's ``hand_over``. If the run has not stopped after
    ``grace_s`` seconds, the signal is sent again and the hand-over happens where the run is. Yields None outside a
    submitit job (no handler to defer: both signals are left alone).
    """
    preemption = _preemption_signal()
    handlers = {sig: signal.getsignal(sig) for sig in (preemption, signal.SIGTERM)}
    if not callable(handlers[preemption]):
        yield None
        return
    _PREEMPTED.clear()
    request = _StopRequest(preemption, handlers)
    for sig in handlers:
        signal.signal(sig, lambda sig, frame: request.on_signal(sig, frame, grace_s))
    try:
        yield request
    finally:
        request.cancel_timers()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        _PREEMPTED.clear()  # the request was this run's


class CheckpointableRun(submitit.helpers.Checkpointable):
    """The callable every job runs: one run of the study, checkpointable.

    In a job, a run that ends with a ``BaseException`` other than a stop (``KeyboardInterrupt``: the local
    controller's SIGINT; a ``SystemExit``) is raised again as a ``RuntimeError`` naming it, so that submitit records
    it as the job's error and the driver reports that cause, not the last line of the job's log.

    Args:
        run: the study's run function (``RunSpec -> RunResult``), picklable. A requeued job calls it again
            with the same spec: it resumes from what it saved in its run folder, if anything.
        cpus_per_task: torch's threads in the job (``threads`` may read the job's own allocation instead).
        grace_s: seconds the run has to stop at a step end after a stop signal.
    """

    def __init__(self, run: Callable[[RunSpec], RunResult], cpus_per_task: int = 1, grace_s: float = 60.0) -> None:
        self.run = run
        self.cpus_per_task = cpus_per_task
        self.grace_s = grace_s

    def __call__(self, spec: RunSpec) -> RunResult:
        torch.set_num_threads(self.threads())
        _remove_folder_template()
        with _deferred_stop(self.grace_s) as stop:
            try:
                return self.run(spec)
            except RunPreempted:
                if stop is None:
                    raise
                stop.hand_over()  # USR2: submitit's checkpoint() below, requeue, exit; SIGTERM: exit
                raise
            except (KeyboardInterrupt, SystemExit) as exc:
                if stop is None or stop.handed_over:  # not in a job; or the job is ending as its signal asked
                    raise
                if stop.requested:  # the run ended on the stop signal without saving (Lightning's SIGTERM exit)
                    stop.hand_over()
                    raise
                what = type(exc).__name__ + (f": {exc}" if str(exc) else "")
                raise RuntimeError(f"the run ended with {what}") from exc

    def threads(self) -> int:
        """torch's threads in this job: the settings' CPUs per task (a scheduler that allots CPUs overrides it)."""
        return self.cpus_per_task

    def checkpoint(self, spec: RunSpec) -> DelayedSubmission:
        """What the requeued job runs: the same run, which resumes from its run folder."""
        return DelayedSubmission(self, spec)

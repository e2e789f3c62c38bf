"""``HangWatchdog``: a run that SIGTERM or Ctrl-C cannot stop, because its main thread waits in a collective that
a stopped or hung peer never joins, still ends within ``grace_s`` seconds of the signal, with one line naming
what it waited for, the last complete checkpoint and the command that resumes.

Why a thread: Python runs a signal handler only when the main thread is back in the interpreter, and a
collective (gloo, NCCL) waits in C++ until the process-group timeout (15 to 30 minutes), so Lightning's SIGTERM
handler and ``RunCheckpoint``'s Ctrl-C handler never run and only SIGKILL ends the process. The C-level part of
Python's signal handling still runs: for every signal that has a Python handler (Lightning's for SIGTERM,
``RunCheckpoint``'s or Python's default one for SIGINT) it writes the signal's number to the file descriptor
given to ``signal.set_wakeup_fd``. A daemon thread reads it and from then on watches the run's progress on this
rank: the start and end of every batch and the start of every checkpoint save (Lightning's hooks).

The normal path goes first: Lightning stops after the current step, ``RunCheckpoint`` saves ``last`` and the
process exits. When instead ``grace_s`` seconds pass after the later of the signal and the last progress while
the main thread is still inside this trainer's ``fit`` (``validate``, ``test``, ``predict``), the watchdog kills
the processes this one launched (Lightning's launcher starts ranks 1..N-1 of a node as children of its rank 0;
a stopped child cannot handle SIGTERM, only SIGKILL ends it), writes every thread's stack into the run's log,
prints its line (``FailureReport``) and exits with 128 + the signal's number: 143 for SIGTERM, 130 for Ctrl-C.
Every rank has its own watchdog, so ranks started by another launcher (torchrun, SLURM's srun: each rank gets
the signal) end on their own.

It is a Lightning callback, but it lives beside ``bhyt_pl.failures``, whose report it prints, rather than in
``bhyt_pl.callbacks``, which that module builds on.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from typing_extensions import override

from bhyt_pl.failures import FailureReport

__all__ = ["HangWatchdog", "Progress", "describe_progress"]

WATCHED = (signal.SIGTERM, signal.SIGINT)
_STOP = 0
"""The byte ``teardown`` writes to end the thread: no signal has the number 0."""
_RUNS = tuple(getattr(L.Trainer, name).__code__ for name in ("fit", "validate", "test", "predict"))


@dataclass(frozen=True)
class Progress:
    """The last thing the run did on this rank: a batch of ``stage`` ``started`` or ``ended``, or a checkpoint
    save started (``stage="save"``), at the training ``step`` it belongs to, at time ``at`` (the watchdog's
    clock)."""

    stage: str
    step: int
    batch: int | None
    started: bool
    at: float


def describe_progress(progress: Progress | None) -> str:
    """Where the run was when its progress stopped, in a few words.

    Example:
        >>> describe_progress(Progress("training", step=4, batch=3, started=True, at=0.0))
        'training step 4 (batch 3) had started'
    """
    if progress is None:
        return "the run had not started a batch yet"
    if progress.stage == "save":
        return f"the save of the checkpoint of step {progress.step} had started"
    moment = "started" if progress.started else "ended"
    if progress.stage == "training":
        return f"training step {progress.step} (batch {progress.batch}) had {moment}"
    return f"{progress.stage} batch {progress.batch} (at training step {progress.step}) had {moment}"


def _frame_text(frame: FrameType) -> str:
    """``all_reduce (torch/distributed/distributed_c10d.py:2918)``: a frame's function and its file's last parts."""
    path = "/".join(Path(frame.f_code.co_filename).parts[-3:])
    return f"{frame.f_code.co_name} ({path}:{frame.f_lineno})"


class HangWatchdog(L.Callback):
    """Ends a run that a signal (SIGTERM, Ctrl-C) cannot stop because it waits for a peer that stopped answering
    (module docstring): ``grace_s`` seconds after the later of the signal and the run's last progress, it kills
    the ranks this process launched, prints one line and exits with 143 (SIGTERM) or 130 (Ctrl-C).

    The command line adds it (``--hang_watchdog.grace_s``) and gives it its ``FailureReport``, whose line names the
    command that resumes; in a ``Trainer`` of your own the line names the checkpoint to resume from.

    Args:
        grace_s: Seconds without progress after a signal before the run is ended. Longer than any wait of a
            healthy run after a signal: finishing the current step and writing ``last`` (a save that takes
            longer is abandoned; the previous checkpoint stays intact). None: no watchdog, a hung run then ends
            only at the process-group timeout or with SIGKILL.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[HangWatchdog(grace_s=30)], max_steps=10)
    """

    def __init__(self, grace_s: float | None = 60.0) -> None:
        if grace_s is not None and (isinstance(grace_s, bool) or not grace_s > 0):
            raise ValueError(
                f"HangWatchdog: grace_s must be a positive number of seconds or None (off), got {grace_s!r}"
            )
        self.grace_s = None if grace_s is None else float(grace_s)
        self.failure_report: FailureReport | None = None
        """The command line's report (its one-line machinery and resume command); None: one of its own."""
        self._clock: Callable[[], float] = time.monotonic
        self._trainer: L.Trainer | None = None
        self._lock = threading.Lock()
        self._signal: tuple[int, float] | None = None
        """The first watched signal since setup, and when it came."""
        self._progress: Progress | None = None
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._previous_fd = -1
        """The wakeup fd installed before ours (asyncio's, another library's), which gets every byte forwarded."""
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned process gets (``ddp_spawn`` pickles the trainer): the setting; the thread, the pipe,
        the lock and the command line's report belong to this process."""
        return {"grace_s": self.grace_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    # ------------------------------------------------------------------ the trainer's hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
        with self._lock:
            self._signal, self._progress = None, None
        if self.grace_s is not None and self._read_fd is None and threading.current_thread() is threading.main_thread():
            self._install()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._uninstall()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning calls no teardown after an exception. Without a signal the run ends on its own error; after one
        # (SIGTERM's save of ``last`` comes next) the watchdog stays to the end of the process
        with self._lock:
            signalled = self._signal is not None
        if not signalled:
            self._uninstall()

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._progressed("training", trainer.global_step + 1, batch_idx, started=True)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0  # else the step goes on
        self._progressed("training", trainer.global_step + (0 if stepped else 1), batch_idx, started=False)

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._progressed("sanity check" if trainer.sanity_checking else "validation", trainer.global_step, batch_idx,
                         started=True)  # fmt: skip

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._progressed("sanity check" if trainer.sanity_checking else "validation", trainer.global_step, batch_idx,
                         started=False)  # fmt: skip

    @override
    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._progressed("test", trainer.global_step, batch_idx, started=True)

    @override
    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._progressed("test", trainer.global_step, batch_idx, started=False)

    @override
    def on_predict_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._progressed("predict", trainer.global_step, batch_idx, started=True)

    @override
    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._progressed("predict", trainer.global_step, batch_idx, started=False)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._progressed("save", trainer.global_step, None, started=True)

    # ------------------------------------------------------------------ what it knows
    def _progressed(self, stage: str, step: int, batch: int | None, started: bool) -> None:
        with self._lock:
            self._progress = Progress(stage, step, batch, started, self._clock())

    def _signalled(self, signum: int) -> None:
        with self._lock:
            if self._signal is None:
                self._signal = (signum, self._clock())

    def deadline(self) -> float | None:
        """When the run is ended (the watchdog's clock): ``grace_s`` after the later of the first signal and the last
        progress; None before any signal."""
        with self._lock:
            if self._signal is None or self.grace_s is None:
                return None
            last = self._signal[1] if self._progress is None else max(self._signal[1], self._progress.at)
            return last + self.grace_s

    def main_frame_in_run(self) -> FrameType | None:
        """The main thread's innermost frame while it is inside this trainer's ``fit``/``validate``/``test``/
        ``predict``; None once the run is over (a notebook or a script goes on: never end it then)."""
        frame = sys._current_frames().get(threading.main_thread().ident)
        inner = frame
        while frame is not None:
            if any(frame.f_code is run for run in _RUNS) and frame.f_locals.get("self") is self._trainer:
                return inner
            frame = frame.f_back
        return None

    def _launched(self) -> list[tuple[int, subprocess.Popen]]:
        """``(rank, process)`` of the ranks this process launched that still run. Lightning's launcher (its
        ``_SubprocessScriptLauncher``) keeps them in ``procs``; other launchers start none here."""
        trainer = self._trainer
        procs = getattr(trainer.strategy.launcher, "procs", None) if trainer is not None else None
        if not procs:
            return []
        first = trainer.node_rank * trainer.num_devices
        return [(first + local, p) for local, p in enumerate(procs, start=1) if p.poll() is None]

    def hang_line(self, report: FailureReport, signum: int, frame: FrameType | None,
                  launched: list[tuple[int, subprocess.Popen]]) -> str:  # fmt: skip
        """The one line: the signal, where progress stopped and what the run waits for, the processes it kills,
        the last complete checkpoint and the command that resumes."""
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        with self._lock:
            progress = self._progress
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1:
            waits = "a collective with the peer processes did not return (a peer stopped or hangs)"
        else:
            waits = "it did not finish"
        where = f"; the main thread waits in {_frame_text(frame)}" if frame is not None else ""
        killed = ""
        if launched:
            ranks = ", ".join(f"rank {rank} (PID {p.pid})" for rank, p in launched)
            killed = f"; killed the {'ranks' if len(launched) > 1 else 'rank'} this process launched: {ranks}"
        log = report.log_file()
        stacks = f"; every thread's stack in {log}" if log is not None else ""
        return (
            f"stopped by {name}: no progress for {self.grace_s:g} s after the signal: {describe_progress(progress)} "
            f"and {waits}{where}{killed}; {report.resume_hint()}{stacks}"
        )

    # ------------------------------------------------------------------ the thread
    def _install(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it: the C-level handler must never block
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            os.close(read_fd)
            os.close(write_fd)
            return
        self._read_fd, self._write_fd = read_fd, write_fd
        self._thread = threading.Thread(target=self._watch, args=(read_fd,), name="bhyt_pl-hang-watchdog", daemon=True)
        self._thread.start()

    def _uninstall(self) -> None:
        if self._write_fd is None or threading.current_thread() is not threading.main_thread():
            return
        current = signal.set_wakeup_fd(self._previous_fd)
        if current != self._write_fd:  # installed after ours, and forwarding to ours: leave both in place
            signal.set_wakeup_fd(current)
            return
        os.write(self._write_fd, bytes([_STOP]))
        if self._thread is not None:
            self._thread.join(timeout=10)
        os.close(self._read_fd)
        os.close(self._write_fd)
        self._read_fd = self._write_fd = self._thread = None
        self._previous_fd = -1

    def _watch(self, read_fd: int) -> None:
        """Read signal numbers until ``_STOP``; once a watched signal came, end the run at ``deadline``."""
        while True:
            deadline = self.deadline()
            timeout = None if deadline is None else max(deadline - self._clock(), 0.0)
            ready, _, _ = select.select([read_fd], [], [], timeout)
            if ready:
                data = os.read(read_fd, 512)
                if not data:
                    return
                if self._previous_fd >= 0 and data.strip(bytes([_STOP])):
                    try:  # the earlier owner of the wakeup fd still hears of every signal
                        os.write(self._previous_fd, data.replace(bytes([_STOP]), b""))
                    except OSError:
                        pass
                for signum in data:
                    if signum == _STOP:
                        return
                    if signum in WATCHED:
                        self._signalled(signum)
                continue
            if deadline is None or self._clock() < deadline:
                continue
            frame = self.main_frame_in_run()
            if frame is None:  # the run is over and the process goes on (a notebook, a script): not ours to end
                with self._lock:
                    self._signal = None
                continue
            self.end_run(frame)
            return

    def end_run(self, frame: FrameType | None) -> None:
        """Kill the ranks this process launched, print the line and exit with 128 + the signal's number."""
        with self._lock:
            signum = self._signal[0] if self._signal is not None else int(signal.SIGTERM)
        report = self.failure_report if self.failure_report is not None else FailureReport(None)
        if report.trainer is None:
            report.trainer = self._trainer
        launched = self._launched()
        line = self.hang_line(report, signum, frame, launched)
        self._write_stacks(report.log_file(), signum)

        def kill_launched() -> None:
            for _, proc in launched:
                proc.send_signal(signal.SIGKILL)
            for _, proc in launched:
                try:  # reaped here, so no zombie is left behind
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

        report.end_process(line, 128 + signum, kill_launched)

    def _write_stacks(self, log: Path | None, signum: int) -> None:
        if log is None:
            return
        try:
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"bhyt_pl: no progress for {self.grace_s:g} s after {signal.Signals(signum).name}; "
                        f"the stack of every thread:\n")  # fmt: skip
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError:  # the console line still comes
            pass

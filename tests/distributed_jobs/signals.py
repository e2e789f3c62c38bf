"""Callbacks for signal tests: ``AnnounceAndSlow`` announces itself in a file after a given step and slows
the run down, so the test process can send a real signal while training is under way; ``SignalAt`` sends
its own process a signal after a given step (Ctrl-C's SIGINT, SLURM's SIGUSR1); ``StopRankAt`` freezes one
rank of a multi-process run with SIGSTOP at a given step."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import lightning as L


class AnnounceAndSlow(L.Callback):
    def __init__(self, marker: str, after_step: int = 5, seconds_per_step: float = 0.5) -> None:
        self.marker, self.after_step, self.seconds_per_step = marker, after_step, seconds_per_step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.after_step:
            Path(self.marker).write_text(str(trainer.global_step))
            time.sleep(self.seconds_per_step)


class SignalAt(L.Callback):
    def __init__(self, step: int, signum: int = int(signal.SIGINT)) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class StopRankAt(L.Callback):
    """Rank ``rank`` stops itself with SIGSTOP at the end of its ``steps``-th step after the run (or its resume)
    started, before that step's save, after writing its PID to ``marker``: a peer that stops answering."""

    def __init__(self, marker: str, steps: int, rank: int = 1) -> None:
        self.marker, self.steps, self.rank = marker, steps, rank
        self._start = 0

    def on_train_start(self, trainer: L.Trainer, *args) -> None:
        self._start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self._start + self.steps and trainer.global_rank == self.rank:
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)

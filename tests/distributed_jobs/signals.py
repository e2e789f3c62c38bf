"""A callback for signal tests: after a given step it announces itself in a file and slows the run down,
so the test process can send a real signal while training is under way."""

from __future__ import annotations

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

"""The Lightning callbacks and the logger of a study run: divergence detection (with the per-step losses and the
training throughput), depth statistics along training, and an in-memory logger the study reads
StabilityMonitor's columns from."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from bhyt_pl.study.protocol.metrics import trajectory_point
from bhyt_pl.study.protocol.spec import TrajectoryPoint
from bhyt_pl.study.run.measure import depth_statistics

__all__ = ["DivergenceMonitor", "MemoryLogger", "TrajectoryRecorder"]


class DivergenceMonitor(L.Callback):
    """Records the training loss of every optimizer step and stops the fit when it diverges.

    A step diverges when its loss is NaN, infinite or above ``max_loss``. The fit then stops through
    ``trainer.should_stop`` (a normal end: loggers flush and close, nothing raises), so the run keeps
    its partial logs and the study goes on with the next run. ``state_dict`` carries the losses, tokens and
    training seconds so far: a resumed fit adds its own to them.

    Args:
        max_loss: the bound (the initial loss of a ``V``-token vocabulary is about ``ln V``).

    Example:
        >>> monitor = DivergenceMonitor(max_loss=12.0)
        >>> trainer = L.Trainer(callbacks=[monitor], max_steps=1, logger=False)
    """

    def __init__(self, max_loss: float) -> None:
        if not max_loss > 0:
            raise ValueError(f"max_loss must be > 0, got {max_loss}")
        self.max_loss = max_loss
        self.losses: list[tuple[int, float]] = []
        self.diverged_step: int | None = None
        self.diverged_loss: float | None = None
        self.tokens = 0
        self.train_seconds = 0.0
        self._seconds_before = 0.0  # training seconds of the earlier tries this fit resumed
        self._started: float | None = None

    def _seconds(self) -> float:
        return self._seconds_before + (time.perf_counter() - self._started if self._started is not None else 0.0)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._started is not None:
            self.train_seconds = self._seconds()

    @override
    def state_dict(self) -> dict[str, object]:
        return {
            "losses": list(self.losses),
            "diverged_step": self.diverged_step,
            "diverged_loss": self.diverged_loss,
            "tokens": self.tokens,
            "train_seconds": self._seconds(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.losses = [(int(step), float(loss)) for step, loss in state_dict["losses"]]
        self.diverged_step, self.diverged_loss = state_dict["diverged_step"], state_dict["diverged_loss"]
        self.tokens = int(state_dict["tokens"])
        self._seconds_before = self.train_seconds = float(state_dict["train_seconds"])

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        self.tokens += int(batch["input_ids"].numel()) * trainer.world_size
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        value = float(trainer.strategy.reduce(loss.detach(), reduce_op="mean"))  # same decision on every rank
        step = trainer.global_step
        self.losses.append((step, value))
        if not math.isfinite(value) or value > self.max_loss:
            self.diverged_step, self.diverged_loss = step, value
            trainer.should_stop = True


class TrajectoryRecorder(L.Callback):
    """Depth statistics and validation loss on fixed batches (eval mode, no gradients) every ``every_n_steps``
    optimizer steps.

    Args:
        batches: the fixed batches the statistics are measured on (the same in every run of a study).
        every_n_steps: the cadence; the points are ``trajectory_point`` records in ``points`` (its ``state_dict``:
            a resumed fit goes on from them).
    """

    def __init__(self, batches: list[dict[str, torch.Tensor]], every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.batches, self.every_n_steps = batches, every_n_steps
        self.points: list[TrajectoryPoint] = []

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step < trainer.max_steps and not trainer.should_stop:
            self.points.append(trajectory_point(step, depth_statistics(pl_module, self.batches)))

    @override
    def state_dict(self) -> dict[str, list[TrajectoryPoint]]:
        return {"points": list(self.points)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.points[:] = state_dict["points"]  # in place: the run may hold the list


class MemoryLogger(Logger):
    """Keeps every logged metric in memory (``metrics[name] = [(step, value), ...]``): the study reads
    StabilityMonitor's columns from here instead of parsing CSV files. ``state_dict``/``load_state_dict`` carry
    them across a preempted run's tries (a logger is not a callback: ``RunCheckpointOnPreemption`` saves them)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[tuple[int, float]]] = {}

    @property
    @override
    def name(self) -> str:
        return "memory"

    @property
    @override
    def version(self) -> str:
        return "0"

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append((int(step or 0), float(value)))

    def state_dict(self) -> dict[str, dict[str, list[tuple[int, float]]]]:
        return {"metrics": {key: list(values) for key, values in self.metrics.items()}}

    def load_state_dict(self, state_dict: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]]) -> None:
        self.metrics = {key: [(int(s), float(v)) for s, v in values] for key, values in state_dict["metrics"].items()}

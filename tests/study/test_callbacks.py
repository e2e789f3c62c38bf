"""A study run's callbacks (``bhyt_pl.study.run.callbacks``): the divergence bound, the trajectory cadence and the
in-memory logger, on scripted trainers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.study.run import callbacks
from bhyt_pl.study.run.callbacks import DivergenceMonitor, MemoryLogger, TrajectoryRecorder


def _fake_trainer(step: int) -> SimpleNamespace:
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: t)
    return SimpleNamespace(global_step=step, world_size=1, should_stop=False, strategy=strategy)


@pytest.mark.parametrize(("loss", "diverged"), [(4.0, False), (5.5, True), (math.nan, True), (math.inf, True)])
def test_divergence_monitor_bound(loss: float, diverged: bool) -> None:
    monitor = DivergenceMonitor(max_loss=5.0)
    trainer = _fake_trainer(7)
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    monitor.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, batch, 0)
    assert trainer.should_stop is diverged
    assert monitor.diverged_step == (7 if diverged else None)
    assert monitor.tokens == 6 and monitor.losses[0][0] == 7


def test_divergence_monitor_rejects_bad_bound() -> None:
    with pytest.raises(ValueError, match="max_loss must be > 0"):
        DivergenceMonitor(max_loss=0.0)


def test_trajectory_recorder_measures_every_n_steps_until_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callbacks, "depth_statistics", lambda module, batches: {"magnitude/layer_00": 1.0})
    recorder = TrajectoryRecorder([], every_n_steps=2)
    for step in range(1, 7):  # global_step after each optimizer step; the last (6) is the fit's end, recorded apart
        trainer = SimpleNamespace(global_step=step, max_steps=6, should_stop=False)
        recorder.on_train_batch_end(trainer, None, None, None, 0)
    assert [p["step"] for p in recorder.points] == [2, 4] and recorder.points[0]["magnitude"] == [1.0]
    with pytest.raises(ValueError, match="every_n_steps must be >= 1"):
        TrajectoryRecorder([], every_n_steps=0)


def test_memory_logger_keeps_every_logged_value_by_step() -> None:
    logger = MemoryLogger()
    logger.log_metrics({"stability/loss_spikes": 1, "a": 2.5}, step=3)
    logger.log_metrics({"stability/loss_spikes": 2}, step=None)
    assert logger.metrics == {"stability/loss_spikes": [(3, 1.0), (0, 2.0)], "a": [(3, 2.5)]}
    assert (logger.name, logger.version) == ("memory", "0")


def test_the_callbacks_state_carries_a_run_across_a_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a preempted run saves and its next try loads: the next try goes on from the same records, and its
    training seconds add to the earlier try's."""
    clock = iter([10.0, 13.5, 100.0, 102.0])  # try 1 starts, is saved; try 2 starts, ends
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: next(clock))
    first = DivergenceMonitor(max_loss=5.0)
    first.on_train_start(None, None)
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    for step, loss in ((1, 4.0), (2, 3.5)):
        first.on_train_batch_end(_fake_trainer(step), None, {"loss": torch.tensor(loss)}, batch, 0)
    state = first.state_dict()
    assert state["train_seconds"] == 3.5 and state["tokens"] == 12
    second = DivergenceMonitor(max_loss=5.0)
    second.load_state_dict(state)
    second.on_train_start(None, None)
    second.on_train_batch_end(_fake_trainer(3), None, {"loss": torch.tensor(3.0)}, batch, 0)
    second.on_train_end(None, None)
    assert second.losses == [(1, 4.0), (2, 3.5), (3, 3.0)] and second.tokens == 18
    assert second.train_seconds == 3.5 + 2.0

    recorder = TrajectoryRecorder([], every_n_steps=2)
    held = recorder.points  # the run holds the list: it is refilled, not replaced
    recorder.load_state_dict({"points": [{"step": 0}, {"step": 2}]})
    assert held == [{"step": 0}, {"step": 2}] and recorder.state_dict() == {"points": held}

    logger = MemoryLogger()
    logger.log_metrics({"stability/loss_spikes": 1}, step=3)
    again = MemoryLogger()
    again.load_state_dict(logger.state_dict())
    again.log_metrics({"stability/loss_spikes": 2}, step=4)
    assert again.metrics == {"stability/loss_spikes": [(3, 1.0), (4, 2.0)]}

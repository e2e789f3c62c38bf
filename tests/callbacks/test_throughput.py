"""TokenThroughputMonitor against a scripted clock: tokens/s, samples/s, FLOP/s, MFU, memory, progress bar."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer
from test_depth_stats import MemoryLogger

from bhyt_pl.callbacks import TokenThroughputMonitor, peak_flops_for
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.module import LlamaLM

SECONDS_PER_BATCH = 0.25


class ScriptedClock:
    """``time.perf_counter`` replacement that only moves when a batch starts (by ``SECONDS_PER_BATCH``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TickAndCount(L.Callback):
    """Advances the clock at every batch start and counts the tokens and samples the test saw."""

    def __init__(self, clock: ScriptedClock) -> None:
        self.clock, self.tokens, self.samples = clock, 0, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.clock.now += SECONDS_PER_BATCH
        self.tokens += batch["input_ids"].numel()
        self.samples += batch["input_ids"].shape[0]


def run(monkeypatch: pytest.MonkeyPatch, monitor: TokenThroughputMonitor, steps: int = 6):
    clock = ScriptedClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    counter = TickAndCount(clock)
    logger = MemoryLogger()
    lm = LlamaLM(overrides=TINY_OVERRIDES, seq_len=32, warmup_steps=0)
    # no validation: the scripted clock moves only at training batches, and the throughput of a validation pass
    # (the one every fit runs at its last step) needs a clock that moves
    trainer = quiet_trainer(
        callbacks=[counter, monitor], logger=logger, max_steps=steps, log_every_n_steps=1, limit_val_batches=0
    )
    trainer.fit(lm, datamodule=TokenDataModule(seq_len=32, batch_size=4))
    return trainer, lm, counter, logger


def test_tokens_per_sec_equals_counted_tokens_over_scripted_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor = TokenThroughputMonitor(window_size=3, peak_flops=2.0e9)
    trainer, lm, counter, logger = run(monkeypatch, monitor, steps=6)
    last = logger.history[max(logger.history)]
    elapsed = counter.clock.now - 1000.0  # all batches, measured by the test's own clock
    assert counter.tokens == 6 * 4 * 32
    assert last["train/tokens_per_sec"] == pytest.approx(counter.tokens / elapsed, rel=1e-9)
    assert last["train/tokens_per_sec_per_device"] == pytest.approx(counter.tokens / elapsed, rel=1e-9)
    assert last["train/samples_per_sec"] == pytest.approx(counter.samples / elapsed, rel=1e-9)
    assert last["train/tokens"] == counter.tokens
    flops_per_batch = 4 * 32 * training_flops_per_token(lm.config, 32)
    assert lm.flops_per_batch == pytest.approx(flops_per_batch)
    assert last["train/flops_per_sec"] == pytest.approx(flops_per_batch / SECONDS_PER_BATCH, rel=1e-9)
    assert last["train/mfu"] == pytest.approx(flops_per_batch / SECONDS_PER_BATCH / 2.0e9, rel=1e-9)
    assert last["memory/rss_gib"] > 0.01 and last["memory/peak_rss_gib"] >= last["memory/rss_gib"] * 0.99
    # no rate before the window of 3 batches is full (batches 1 and 2, logged at steps 0 and 1 as train/loss is)
    assert "train/tokens_per_sec" not in logger.history[1] and "train/tokens_per_sec" in logger.history[2]
    # the same steps as train/loss, not one step ahead of it
    loss_steps = {step for step, metrics in logger.history.items() if "train/loss" in metrics}
    rate_steps = {step for step, metrics in logger.history.items() if "train/tokens_per_sec" in metrics}
    assert loss_steps == set(range(6)) and rate_steps == loss_steps - {0, 1}
    assert trainer.progress_bar_metrics["train/tokens_per_sec"] == pytest.approx(counter.tokens / elapsed)


def test_no_mfu_on_cpu_without_a_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, logger = run(monkeypatch, TokenThroughputMonitor(window_size=2), steps=3)
    last = logger.history[max(logger.history)]
    assert "train/flops_per_sec" in last and "train/mfu" not in last


def test_peak_flops_table() -> None:
    assert peak_flops_for("NVIDIA H200", torch.bfloat16) == 989e12
    assert peak_flops_for("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe", torch.float16) == 756e12
    assert peak_flops_for("NVIDIA H200", torch.float32, tf32=True) == 494.5e12
    assert peak_flops_for("NVIDIA H200", torch.float32, tf32=False) == 67e12
    assert peak_flops_for("Some CPU", torch.bfloat16) is None
    assert peak_flops_for("NVIDIA H200", torch.int8) is None


def test_rename_scales_global_rates_by_world_size() -> None:
    raw = {"time": 3.0, "samples": 8, "lengths": 256, "device/items_per_sec": 100.0, "device/mfu": 0.4,
           "device/flops_per_sec": 5.0, "device/samples_per_sec": 2.0}  # fmt: skip
    out = TokenThroughputMonitor.rename(raw, "train", world_size=4)
    assert out["train/tokens_per_sec"] == 400.0 and out["train/tokens_per_sec_per_device"] == 100.0
    assert out["train/flops_per_sec"] == 20.0 and out["train/mfu"] == 0.4 and out["train/samples_per_sec"] == 8.0


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"peak_flops": 0}, "peak_flops must be > 0"), ({"window_size": 1}, "window_size")]
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TokenThroughputMonitor(**kwargs)


def test_validation_and_memory_metrics_are_logged_at_the_steps_of_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the global step, as every other metric, not at the validation batch counter (1, 2, 3, 4, 5, 6 over
    two validations), against which their curves would zig-zag."""
    logger = MemoryLogger()
    lm = LlamaLM(overrides=TINY_OVERRIDES, seq_len=32, warmup_steps=0)
    trainer = quiet_trainer(
        callbacks=[TokenThroughputMonitor(window_size=2)], logger=logger, max_steps=4, log_every_n_steps=1,
        val_check_interval=2, limit_val_batches=3, check_val_every_n_epoch=None,
    )  # fmt: skip
    trainer.fit(lm, datamodule=TokenDataModule(seq_len=32, batch_size=4))
    history = logger.history.items()
    validate_steps = {step for step, metrics in history if any(k.startswith("validate/") for k in metrics)}
    # at the steps of val/loss (Lightning's counter of optimizer steps before the current one: 1 and 3)
    assert validate_steps == {step for step, metrics in history if "val/loss" in metrics} == {1, 3}
    memory_steps = {step for step, metrics in history if "memory/rss_gib" in metrics}
    assert memory_steps <= {0, 1, 2, 3} and {1, 3} <= memory_steps

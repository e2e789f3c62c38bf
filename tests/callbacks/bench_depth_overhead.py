"""Overhead of DepthStatsMonitor on the ``tiny`` preset (d=128, 4 layers, vocab 8192), CPU.

    .venv/bin/python tests/callbacks/bench_depth_overhead.py --steps 60 --every 10 --runs 2

Two measurements:
1. In-run: step wall times (batch start to next batch start, so hooks, reduction, scalar writes and
   figures are included) with the monitor logging every ``--every`` steps; the extra time of a
   logging step over the median ordinary step, scaled to one logging step per 100 steps.
2. Interleaved whole runs of ``--steps`` steps with the monitor at every 100 steps and without it,
   alternating, ``--runs`` pairs: ratio of the median times (noisy on shared cores: +-10% per step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lm_fixtures import TokenDataModule  # noqa: E402

from bhyt_pl.callbacks import DepthStatsMonitor  # noqa: E402
from bhyt_pl.module import LlamaLM  # noqa: E402


class StepClock(L.Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        self.starts.append(time.perf_counter())


def train(norm: str, steps: int, monitor: DepthStatsMonitor | None, log_dir: str) -> list[float]:
    torch.manual_seed(0)
    lm = LlamaLM(preset="tiny", norm=norm, seq_len=128, warmup_steps=0)
    clock = StepClock()
    callbacks = [clock] + ([monitor] if monitor else [])
    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=TensorBoardLogger(log_dir, name=norm), callbacks=callbacks,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=50,
        limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(lm, datamodule=TokenDataModule(seq_len=128, batch_size=8, vocab=8192, n=8 * steps))
    return [b - a for a, b in zip(clock.starts, clock.starts[1:])]  # seconds per step, step 1 first


def logging_step_overhead(times: list[float], should_log) -> tuple[float, float]:
    """``(median ordinary step, median extra time of a logging step)`` in seconds from per-step times;
    steps 1-2 (warm-up, the first log) are left out of both. Prints the figures."""
    logging_steps = [s for s in range(2, len(times) + 1) if should_log(s)]
    ordinary = [t for s, t in enumerate(times, 1) if s > 2 and not should_log(s)]
    base = statistics.median(ordinary)
    extra = [times[s - 1] - base for s in logging_steps]
    print(f"median ordinary step {base * 1e3:.1f} ms; step 1 (first log, imports matplotlib) {times[0]:.2f} s")
    print(f"logging steps {logging_steps}: extra {[round(e * 1e3) for e in extra]} ms")
    return base, statistics.median(extra)


def interleaved_runs(norm: str, steps: int, runs: int, make_monitor, log_dir: str) -> None:
    """Whole runs with the monitor at every 100 steps and without it, alternating; prints the ratio
    (``runs`` 0: nothing)."""
    if runs < 1:
        return
    totals: dict[str, list[float]] = {"off": [], "every100": []}
    for _ in range(runs):
        for mode in ("off", "every100"):  # interleaved
            mon = make_monitor() if mode == "every100" else None
            totals[mode].append(sum(train(norm, steps, mon, log_dir)))
    off, on = statistics.median(totals["off"]), statistics.median(totals["every100"])
    print(f"whole runs of {steps} steps, {runs} interleaved pairs: off {totals['off']} s, "
          f"every 100 {totals['every100']} s; median ratio {on / off:.3f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--norm", default="bhyt")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        monitor = DepthStatsMonitor(every_n_steps=args.every)
        times = train(args.norm, args.steps, monitor, tmp)
        base, per_log = logging_step_overhead(times, monitor.should_log)
        print(f"in-run estimate at every 100 steps: {per_log * 1e3:.0f} ms / (100 x {base * 1e3:.1f} ms) = "
              f"{100 * per_log / (100 * base):.2f}%")  # fmt: skip
        interleaved_runs(args.norm, args.steps, args.runs, lambda: DepthStatsMonitor(every_n_steps=100), tmp)


if __name__ == "__main__":
    main()

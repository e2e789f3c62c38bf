"""Overhead of StabilityMonitor on the ``tiny`` preset (d=128, 4 layers, vocab 8192), CPU.

    .venv/bin/python tests/callbacks/bench_stability_overhead.py --steps 60 --every 10 --runs 2

1. In-run: step wall times (batch start to next batch start, so the hooks, the extra attention pass,
   the reduction, scalar writes and figures are included) with the monitor computing its per-layer
   statistics every ``--every`` steps. The extra time of a logging step over the median ordinary step,
   scaled to one logging step per 100 steps. The per-step cost (spike detection: one gradient-norm pass
   and two scalars) is timed directly around the two hooks that do it, against forward + backward.
2. Interleaved whole runs of ``--steps`` steps with the monitor at every 100 steps and without it,
   alternating, ``--runs`` pairs (0: skip): ratio of the median times (noisy on shared cores: +-10% per step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_depth_overhead import interleaved_runs, logging_step_overhead, train  # noqa: E402

from bhyt_pl.callbacks import StabilityMonitor  # noqa: E402
from bhyt_pl.module import LlamaLM  # noqa: E402


def per_step_cost(norm: str, repeats: int = 8) -> tuple[float, float]:
    """Median seconds of forward + backward and of the monitor's every-step work (not a logging step)."""
    torch.manual_seed(0)
    lm = LlamaLM(preset="tiny", norm=norm, seq_len=128)
    lm.configure_model()
    ids = torch.randint(0, lm.config.vocab_size, (8, 128))
    trainer = types.SimpleNamespace(world_size=1, is_global_zero=True, global_step=5, log_every_n_steps=50,
                                    loggers=[], accumulate_grad_batches=1)  # fmt: skip
    monitor = StabilityMonitor()
    steps, hooks = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = F.cross_entropy(lm.model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        t1 = time.perf_counter()
        monitor.on_before_optimizer_step(trainer, lm, None)
        monitor.on_train_batch_end(trainer, lm, {"loss": loss}, None, 0)
        hooks.append(time.perf_counter() - t1)
        steps.append(t1 - t0)
        lm.zero_grad()
    return statistics.median(steps[1:]), statistics.median(hooks[1:])  # the first is warm-up


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--norm", default="bhyt")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        step_time, hook_time = per_step_cost(args.norm)
        per_step = hook_time / step_time
        print(f"every step: {hook_time * 1e3:.2f} ms of spike tracking per {step_time * 1e3:.1f} ms forward+backward "
              f"= {100 * per_step:.2f}%")  # fmt: skip
        monitor = StabilityMonitor(every_n_steps=args.every)
        times = train(args.norm, args.steps, monitor, tmp)
        base, per_log = logging_step_overhead(times, monitor.should_log)
        print(f"at every 100 steps: {per_log * 1e3:.0f} ms / (100 x {base * 1e3:.1f} ms) = "
              f"{100 * per_log / (100 * base):.2f}% + every step {100 * per_step:.2f}% = "
              f"{100 * (per_log / (100 * base) + per_step):.2f}% of training time")  # fmt: skip
        interleaved_runs(args.norm, args.steps, args.runs, lambda: StabilityMonitor(every_n_steps=100), tmp)


if __name__ == "__main__":
    main()

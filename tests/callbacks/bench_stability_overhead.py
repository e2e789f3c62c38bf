"""Overhead of StabilityMonitor on the ``tiny`` preset (d=128, 4 layers, vocab 8192), CPU.

    .venv/bin/python tests/callbacks/bench_stability_overhead.py --steps 60 --every 10 --runs 2

1. In-run: step wall times (batch start to next batch start, so the hooks, the extra attention pass,
   the reduction, scalar writes and figures are included) with the monitor computing its per-layer
   statistics every ``--every`` steps. The extra time of a logging step over the median ordinary step,
   scaled to one logging step per 100 steps, plus the per-step cost (spike detection: one gradient-norm
   pass and two scalars) measured as the median ordinary step with the monitor over the median without.
2. Interleaved whole runs of ``--steps`` steps with the monitor at every 100 steps and without it,
   alternating, ``--runs`` pairs (0: skip): ratio of the median times (noisy on shared cores: +-10% per step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_depth_overhead import train  # noqa: E402

from bhyt_pl.callbacks import StabilityMonitor  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--norm", default="bhyt")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = train(args.norm, args.steps, None, tmp)
        monitor = StabilityMonitor(every_n_steps=args.every)
        times = train(args.norm, args.steps, monitor, tmp)
        logging_steps = [s for s in range(2, args.steps + 1) if monitor.should_log(s)]
        ordinary = [t for s, t in enumerate(times, 1) if s > 2 and not monitor.should_log(s)]
        base = statistics.median(ordinary)
        base_plain = statistics.median(plain[2:])
        extra = [times[s - 1] - base for s in logging_steps]
        per_log = statistics.median(extra)
        per_step = base / base_plain - 1
        print(f"median ordinary step {base * 1e3:.1f} ms with the monitor, {base_plain * 1e3:.1f} ms without "
              f"(per-step spike tracking {100 * per_step:+.2f}%); step 1 {times[0]:.2f} s")  # fmt: skip
        print(f"logging steps {logging_steps}: extra {[round(e * 1e3) for e in extra]} ms")
        print(f"in-run estimate at every 100 steps: {per_log * 1e3:.0f} ms / (100 x {base * 1e3:.1f} ms) = "
              f"{100 * per_log / (100 * base):.2f}% + per-step {100 * per_step:.2f}%")  # fmt: skip

        if args.runs < 1:  # --runs 0: the in-run estimate only
            return
        totals: dict[str, list[float]] = {"off": [], "every100": []}
        for _ in range(args.runs):
            for mode in ("off", "every100"):  # interleaved
                mon = StabilityMonitor(every_n_steps=100) if mode == "every100" else None
                totals[mode].append(sum(train(args.norm, args.steps, mon, tmp)))
        off, on = statistics.median(totals["off"]), statistics.median(totals["every100"])
        print(f"whole runs of {args.steps} steps, {args.runs} interleaved pairs: off {totals['off']} s, "
              f"every 100 {totals['every100']} s; median ratio {on / off:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()

"""One study run (``bhyt_pl.study.run.runner.run_one``) at the default study's settings, eager and compiled, side
by side: the wall time a study pays per run, first compile included (docs/performance.md, "Study run")."""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

__all__ = ["STUDY_PATHS", "study_run_table"]

STUDY_PATHS = {"eager": False, "compiled": True}
"""The two ways a study run can execute: ``TrainerSettings(compile=...)``."""


def study_run_table(schemes: list[str], steps: int | None, repeats: int) -> dict[str, Any]:
    """Time ``run_one`` for every scheme and path, ``repeats`` times each, interleaved (eager and compiled of one
    scheme back to back, their order alternating between repetitions).

    Each path's first repetition in this process includes its one-off costs (the compiled path's dynamo tracing
    and Inductor compile, or cache load when ``TORCHINDUCTOR_CACHE_DIR`` is warm); later ones reuse them, as
    the later runs of a study worker do. Both are reported.

    Args:
        schemes: registered norm schemes (e.g. ``["rmsnorm", "bhyt"]``).
        steps: optimizer steps per run; None: the default study's (``bhyt_pl.study.cli.exploration.FULL``).
        repeats: runs per scheme and path.

    Returns:
        ``{"settings": {...}, "runs": {scheme: {path: {"wall_s": [...], "train_s": [...], ...}}},
        "ratio": {scheme: {...}}}``.
    """
    from bhyt_pl.study.cli.exploration import prepare
    from bhyt_pl.study.protocol.spec import RunStatus, TrainerSettings
    from bhyt_pl.study.run.runner import run_one

    if repeats < 1:
        raise ValueError(f"study_run repeats must be >= 1, got {repeats}")
    setup = prepare([] if steps is None else ["--steps", str(steps)])  # the default study's settings
    budget, base, factory = setup.budget, setup.base, setup.data
    batches = setup.validation_batches()
    # one grid rate for every scheme (the middle of the default grid); the runs the study reports measure layer
    # importance, so these do too
    specs = {name: replace(base, label=name, norm=name, lr=3e-3, importance=True) for name in schemes}
    runs: dict[str, dict[str, dict[str, list[float]]]] = {
        n: {p: {"wall_s": [], "train_s": [], "final_train_loss": [], "val_loss": []} for p in STUDY_PATHS}
        for n in schemes
    }
    with tempfile.TemporaryDirectory(prefix="bench_study_run_") as tmp:
        for r in range(repeats):
            for name in schemes:
                paths = list(STUDY_PATHS) if r % 2 == 0 else list(reversed(STUDY_PATHS))
                for path in paths:
                    settings = TrainerSettings(compile=STUDY_PATHS[path])
                    start = time.perf_counter()
                    result = run_one(specs[name], factory, batches, settings, Path(tmp) / path)
                    wall = time.perf_counter() - start
                    if result.status != RunStatus.OK:
                        raise RuntimeError(f"study_run {name} {path}: {result.status} {result.error or ''}")
                    entry = runs[name][path]
                    entry["wall_s"].append(wall)
                    entry["train_s"].append(result.train_seconds)
                    entry["final_train_loss"].append(result.losses[-1][1])
                    entry["val_loss"].append(result.val_loss)
    ratio = {}
    for name, by_path in runs.items():
        eager, compiled = by_path["eager"]["wall_s"], by_path["compiled"]["wall_s"]
        ratio[name] = {
            "first_run": compiled[0] / eager[0],
            "later_runs_median": statistics.median(c / e for c, e in zip(compiled[1:], eager[1:], strict=True))
            if repeats > 1
            else None,
            "val_loss_abs_diff": abs(by_path["compiled"]["val_loss"][0] - by_path["eager"]["val_loss"][0]),
        }
    return {
        "settings": {
            "preset": budget.preset,
            "steps": budget.steps,
            "batch": f"{budget.batch_size} x {budget.seq_len}",
            "trajectory_every": budget.trajectory_every,
            "val_batches": budget.val_batches,
            "importance": True,
            "threads": torch.get_num_threads(),
            "repeats": repeats,
        },
        "runs": runs,
        "ratio": ratio,
    }


def study_run_markdown(table: dict[str, Any]) -> str:
    """The study-run table: wall seconds per run (first, then the median of the later ones) and the ratio."""
    s = table["settings"]
    lines = [
        f"study run ({s['preset']}, {s['steps']} steps of {s['batch']} tokens, {s['threads']} thread(s), trajectory "
        f"every {s['trajectory_every']}, importance; wall s per run, first run includes compile):",
        "",
        "| scheme | eager first | eager later (median) | compiled first | compiled later (median) | compiled / eager "
        "first | compiled / eager later | val loss diff |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def later(values: list[float]) -> str:
        return f"{statistics.median(values[1:]):.1f}" if len(values) > 1 else "-"

    for name, by_path in table["runs"].items():
        e, c, r = by_path["eager"]["wall_s"], by_path["compiled"]["wall_s"], table["ratio"][name]
        later_ratio = "-" if r["later_runs_median"] is None else f"{r['later_runs_median']:.3f}"
        lines.append(
            f"| {name} | {e[0]:.1f} | {later(e)} | {c[0]:.1f} | {later(c)} | {r['first_run']:.3f} | {later_ratio} "
            f"| {r['val_loss_abs_diff']:.2e} |"
        )
    return "\n".join(lines)

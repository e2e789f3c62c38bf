"""``python -m bhyt_pl study --dry-run``: what a study costs before it trains anything.

The depth study plans as it goes (``bhyt_pl.study.launch.execution``): grid extensions when a group's best rate sits
at an
edge, the matched arm once every group is selected. Its run count is therefore a range, derived from the
protocol's rules (``run_range``):

- selection: every candidate of every group at every ``--lrs`` rate on the selection seed (always trained);
- extensions: at most ``--extensions`` a group (0 when the grid has one rate: no ratio to step by). ``plan.select``
  extends only the candidate of the group's best run, and an extension run either becomes the best (the same
  candidate, at the same edge: it extends again while fewer than ``--extensions`` off-grid rates were tried) or
  loses to the old best, which is then inside its candidate's rates (the group is selected). So the best candidate
  never changes once extensions start, and every extension run adds one off-grid rate;
- evaluation: ``--seeds`` runs at the best rate and at each matched rate, a rate of both arms once
  (``plan.evaluation_specs``). Fewest when the best rate is a matched one, most when it is not.

The compute is ``bhyt_pl.flops.training_flops_per_token`` (matmul FLOPs, forward + backward) times each run's
training tokens (steps x batch x sequence length); GPU-hours divide it by ``MFU x peak``. On the CPU a short
probe (``probe_pace``: a few real training steps of the study's first run, timed after a warm-up step, in this
process) gives seconds per step, times every run's steps, divided by the workers.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bhyt_pl.config import LlamaConfig
from bhyt_pl.errors import UsageError
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.study.launch.scheduler import finished_result
from bhyt_pl.study.protocol.design import StudyDesign, rate_key
from bhyt_pl.study.protocol.plan import default_matched_lrs, evaluation_specs, select, selection_specs, sweep_specs
from bhyt_pl.study.protocol.size import RunSize
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, legacy_label
from bhyt_pl.study.run.data import StudyData
from bhyt_pl.study.run.runner import build_module

if TYPE_CHECKING:
    from bhyt_pl.study.cli.setup import StudyOptions, StudySetup

__all__ = [
    "DEFAULT_MFU",
    "DEFAULT_PEAK_TFLOPS",
    "DEFAULT_PROBE_STEPS",
    "Probe",
    "RunRange",
    "StudyCost",
    "add_arguments",
    "check_arguments",
    "dry_run",
    "dry_run_text",
    "gpu_hours",
    "max_extension_runs",
    "probe_pace",
    "quiet_lightning",
    "read_back",
    "reusable_runs",
    "run_range",
    "study_cost",
]

DEFAULT_MFU = 0.40
"""Model FLOPs utilisation assumed for GPU-hours: a well-tuned dense decoder reaches 35-45 % on one H100/H200."""

DEFAULT_PEAK_TFLOPS = 989.0
"""Peak dense TFLOP/s assumed for GPU-hours: H100 SXM, bf16 (no sparsity). H200 shares it; A100 bf16 is 312."""

DEFAULT_PROBE_STEPS = 5
"""Timed steps of the CPU probe (after one warm-up step): under 5 s for the default study on 2 busy cores."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The dry run's assumptions, as one argument group of the study's parser (``--dry-run`` itself is the driver's)."""
    group = parser.add_argument_group("dry run (print the plan and its cost, train nothing)")
    group.add_argument(
        "--mfu", type=float, default=DEFAULT_MFU, help="model FLOPs utilisation assumed for GPU-hours, in (0, 1]"
    )
    group.add_argument(
        "--peak-tflops",
        type=float,
        default=DEFAULT_PEAK_TFLOPS,
        help="the accelerator's peak dense TFLOP/s at the runs' precision (default: H100 SXM bf16; A100 bf16: 312)",
    )
    group.add_argument(
        "--probe-steps",
        type=int,
        default=DEFAULT_PROBE_STEPS,
        help="CPU probe: steps of the study's first run timed after a warm-up step (0: no probe, CPU time unknown)",
    )


def check_arguments(args: StudyOptions) -> None:
    """``UsageError`` naming every bad dry-run option, before any work."""
    problems = []
    if not (0 < args.mfu <= 1):
        problems.append(f"--mfu must be in (0, 1] (a fraction: 0.4 is 40 %), got {args.mfu}")
    if not (args.peak_tflops > 0 and math.isfinite(args.peak_tflops)):
        problems.append(f"--peak-tflops must be a finite number > 0 (TFLOP/s, e.g. 989), got {args.peak_tflops}")
    if args.probe_steps < 0:
        problems.append(f"--probe-steps must be >= 0 (0: no probe), got {args.probe_steps}")
    if problems:
        raise UsageError("study dry run: " + "; ".join(problems))


def max_extension_runs(grid_size: int, limit: int) -> int:
    """The most extension runs ``plan.select`` can add to one group: ``limit``, or 0 on a one-rate grid (module
    docstring: one candidate extends, one off-grid rate a run)."""
    return max(0, limit) if grid_size >= 2 else 0


@dataclass(frozen=True)
class RunRange:
    """The runs a study trains, as the protocol decides them: ``selection`` always, up to ``extensions`` more,
    and ``evaluation_min`` .. ``evaluation_max`` evaluation runs (a sweep: all fixed, ``selection`` holds them)."""

    selection: int
    extensions: int = 0
    evaluation_min: int = 0
    evaluation_max: int = 0

    @property
    def minimum(self) -> int:
        return self.selection + self.evaluation_min

    @property
    def maximum(self) -> int:
        return self.selection + self.extensions + self.evaluation_max


def run_range(design: StudyDesign, matched_lrs: Sequence[float] | None = None) -> RunRange:
    """The depth study's run count. The minimum assumes every group keeps a candidate and, with the default
    matched rule, that ``min(2, len(lrs))`` rates qualify (fewer runs only when a group diverges at every rate or a
    rate fails for some group); no extension; each best rate a matched one where it can be. The maximum: every
    extension ``max_extension_runs`` allows and every best rate off the matched ones where it can be."""
    grid = {rate_key(lr) for lr in design.lrs}
    n, r = design.n_seeds, len(design.lrs)
    selection = extensions = low = high = 0
    for g in design.groups:
        c = len(g.candidates)
        selection += c * r
        ext = max_extension_runs(r, design.extensions)
        extensions += ext
        if matched_lrs is not None:
            m = len({rate_key(lr) for lr in matched_lrs})
            best_can_match = any(rate_key(lr) in grid for lr in matched_lrs)
            best_can_differ = bool(ext) or any(k not in {rate_key(lr) for lr in matched_lrs} for k in grid)
            low += n * (m + (0 if best_can_match else 1))
            high += n * (m + (1 if best_can_differ else 0))
        else:  # the default rule: the two highest grid rates every group trained at
            m = min(2, r)
            low += n * m
            high += n * (m + (1 if ext or r > m else 0))
    return RunRange(selection, extensions, low, high)


def read_back(out: Path, spec: RunSpec) -> RunResult | None:
    """The finished run of ``spec`` in ``out``, under its label or its legacy one (read only: nothing renamed)."""
    found = finished_result(out, spec)
    if found is None and legacy_label(spec) != spec.label:
        found = finished_result(out, replace(spec, label=legacy_label(spec)))
        found = replace(found, spec=spec) if found is not None else None
    return found


def reusable_runs(
    design: StudyDesign, base: RunSpec, out: Path, matched_lrs: Sequence[float] | None = None
) -> list[str]:
    """The labels of the runs a study would read back from ``out`` instead of training: the protocol replayed on
    the finished runs, as far as they carry it (a group's extension or evaluation runs count once its selection
    runs are all finished, the matched arm once every group is selected). Reads, never writes."""
    design = StudyDesign(design.groups, design.lrs, design.n_seeds, design.extensions)  # a fresh copy to fill
    reused: list[str] = []

    def found(specs: Sequence[RunSpec]) -> list[RunResult]:
        results = [r for r in (read_back(out, s) for s in specs) if r is not None]
        reused.extend(r.spec.label for r in results if r.spec.label not in reused)
        return results

    for g in design.groups:
        specs = selection_specs(g, design.lrs, base)
        runs = found(specs)
        while len(runs) == len(specs):
            step = select(g, runs, design.lrs, design.extensions, base)
            if isinstance(step, RunSpec):
                specs = [*specs, step]
                runs += found([step])
                continue
            design.selections[g.label] = step
            found(evaluation_specs(g, step, (), design.n_seeds, base))
            break
    if design.complete:
        ordered = [design.selections[g.label] for g in design.groups]
        matched = tuple(sorted(matched_lrs)) if matched_lrs is not None else default_matched_lrs(ordered, design.lrs)
        for g in design.groups:
            found(evaluation_specs(g, design.selections[g.label], matched, design.n_seeds, base))
    return reused


@dataclass(frozen=True)
class Probe:
    """A measured CPU pace: ``seconds_per_step`` over ``steps`` timed steps after a warm-up step of
    ``warmup_seconds``, with ``threads`` torch threads, at ``loadavg`` (1, 5, 15 min) when it ended."""

    label: str
    steps: int
    seconds_per_step: float
    warmup_seconds: float
    threads: int
    loadavg: tuple[float, float, float]


def _loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # not available on this platform
        return (math.nan, math.nan, math.nan)


LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
"""The loggers whose info lines the probe holds back (``quiet_lightning``)."""


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Lightning's info lines held back (warnings and errors still show), its loggers' levels restored after.

    The probe's fit is the dry run's own measurement: its ``GPU available: ...`` and ``Trainer.fit stopped:
    max_steps=6 reached`` lines would read, under a header saying that nothing trains, as a study run."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def probe_pace(spec: RunSpec, data: StudyData, steps: int, compile: bool = False, threads: int | None = None) -> Probe:
    """Train ``spec`` for 1 + ``steps`` optimizer steps in this process (no logger, no checkpoint, no folder left
    behind) and time every step after the first (the first builds the allocator's pools and, compiled, the graphs).

    Args:
        spec: the run to time (its model, scheme and rate; its step count is not used).
        data: ``(data_seed) -> LightningDataModule`` (the study's ``StudyData``).
        steps: timed steps, >= 1.
        compile: compile each block, as the study's runs do.
        threads: torch threads during the probe (a study worker uses 1); None: leave them.
    """
    import lightning as L
    import torch

    if steps < 1:
        raise UsageError(f"--probe-steps must be >= 1 to probe, got {steps}")
    durations: list[float] = []

    class StepTimer(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            durations.append(time.perf_counter() - self.started)

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if compile:
            torch.compiler.reset()
        L.seed_everything(spec.seed, verbose=False)
        datamodule = data(spec.data_seed)
        module = build_module(spec, datamodule, compile)
        with tempfile.TemporaryDirectory(prefix="bhyt-probe-") as root, quiet_lightning():
            trainer = L.Trainer(
                accelerator="cpu",
                devices=1,
                max_steps=steps + 1,
                gradient_clip_val=spec.grad_clip,
                limit_val_batches=0,
                num_sanity_val_steps=0,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=root,
                callbacks=[StepTimer()],
            )
            trainer.fit(module, datamodule=datamodule)
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    if len(durations) < 2:
        raise RuntimeError(f"the probe of {spec.label} trained {len(durations)} step(s); it needs 2 (warm-up + 1)")
    timed = durations[1:]
    return Probe(spec.label, len(timed), sum(timed) / len(timed), durations[0], used_threads, _loadavg())


def gpu_hours(flops: float, mfu: float, peak_tflops: float) -> float:
    """``flops`` at ``mfu`` of ``peak_tflops`` TFLOP/s, in GPU-hours."""
    return flops / (mfu * peak_tflops * 1e12) / 3600.0


def _specs_for_flops(setup: StudySetup) -> list[RunSpec]:
    """The sweep's runs (their depths differ), or the depth study's one model (every run shares it)."""
    if setup.sweep:
        return sweep_specs(setup.groups, setup.budget.depths, setup.budget.lrs, setup.budget.seeds, setup.base)
    return [setup.base]


@dataclass(frozen=True)
class StudyCost:
    """What a study would train and its training compute, before it trains anything.

    Args:
        runs: the run count (a range for the depth study, fixed for the sweep).
        reused: labels of the runs ``--out`` already holds finished with the same settings (read back, not trained).
        tokens_per_run: steps x batch x sequence length.
        flops_per_run: training FLOPs of each run shape (one for the depth study, one per depth for the sweep).
        flops_min, flops_max: training FLOPs of the fewest and of the most runs, reused runs included.
        steps_min, steps_max: optimizer steps of the fewest and of the most runs.
    """

    runs: RunRange
    reused: tuple[str, ...]
    tokens_per_run: int
    flops_per_run: tuple[float, ...]
    flops_min: float
    flops_max: float
    steps_min: int
    steps_max: int


def study_cost(setup: StudySetup) -> StudyCost:
    """``setup``'s run range, reusable runs and training FLOPs (``bhyt_pl.flops.training_flops_per_token`` times
    each run's tokens); reads ``--out``, writes nothing."""
    budget, args = setup.budget, setup.options
    tokens = budget.steps * budget.batch_size * budget.seq_len
    design = setup.design()
    if design is None:
        specs = _specs_for_flops(setup)
        runs = RunRange(len(specs))
        reused = [] if args.restart else [s.label for s in specs if read_back(setup.out, s) is not None]
        flops = [training_flops_per_token(_config(s), budget.seq_len) * tokens for s in specs]
        low = high = sum(flops)
    else:
        matched = args.matched_lrs
        runs = run_range(design, matched)
        reused = [] if args.restart else reusable_runs(design, setup.base, setup.out, matched)
        flops = [training_flops_per_token(setup.config, budget.seq_len) * tokens]
        low, high = flops[0] * runs.minimum, flops[0] * runs.maximum
    return StudyCost(
        runs=runs,
        reused=tuple(reused),
        tokens_per_run=tokens,
        flops_per_run=tuple(sorted(set(flops))),
        flops_min=low,
        flops_max=high,
        steps_min=budget.steps * runs.minimum,
        steps_max=budget.steps * runs.maximum,
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _flops(value: float) -> str:
    return f"{value:.3g} FLOPs"


def _span(low: str, high: str) -> str:
    return low if low == high else f"{low} to {high}"


def dry_run_text(
    setup: StudySetup,
    mfu: float = DEFAULT_MFU,
    peak_tflops: float = DEFAULT_PEAK_TFLOPS,
    probe: Probe | None = None,
    workers: int = 1,
) -> str:
    """What ``--dry-run`` prints: the runs (a range for the depth study), the runs ``--out`` already holds, tokens
    per run, the parameter counts with tokens per parameter (and epochs past one pass over the training data),
    training FLOPs per run and in total, GPU-hours, the CPU time from ``probe`` (None: unknown) with ``workers``
    runs at once, and the assumptions."""
    budget, args = setup.budget, setup.options
    cost = study_cost(setup)
    runs = cost.runs
    lines = [f"study dry run ({setup.mode}, --out {setup.out}): nothing is trained or written", ""]
    design = setup.design()
    if design is None:
        lines.append(f"runs: {runs.minimum} (the sweep's grid: schemes x depths x rates x seeds)")
    else:
        matched = "--matched-lrs" if args.matched_lrs is not None else "the default rule"
        lines += [
            f"runs: {runs.minimum} to {runs.maximum} ({len(design.groups)} groups, {len(design.lrs)} rates, "
            f"{design.n_seeds} evaluation seeds, up to {design.extensions} extension(s) a group)",
            f"  selection (every candidate x rate, selection seed): {runs.selection}",
            f"  grid extensions (a best rate at an edge of the grid): 0 to {runs.extensions}",
            f"  evaluation (best and matched rates, {matched}): {runs.evaluation_min} to {runs.evaluation_max}; "
            "fewer only if a group diverges at every rate or a matched rate fails",
        ]
    restart = " (--restart retrains every run)" if args.restart else ""
    lines.append(f"finished in {setup.out} with the same settings, reused: {len(cost.reused)}{restart}")
    per_run = _span(_flops(cost.flops_per_run[0]), _flops(cost.flops_per_run[-1]))
    lines += [
        "",
        f"tokens per run: {budget.steps} steps x {budget.batch_size} x {budget.seq_len} = {cost.tokens_per_run:,}",
        *_size_lines(setup.sizes()),
        f"training FLOPs per run (bhyt_pl/flops.py: matmuls, forward + backward): {per_run}",
        f"training FLOPs in total: {_span(_flops(cost.flops_min), _flops(cost.flops_max))}",
        f"GPU-hours at {mfu:.0%} MFU of {peak_tflops:g} TFLOP/s: "
        + " to ".join(dict.fromkeys(_hours(gpu_hours(f, mfu, peak_tflops)) for f in cost.flops_per_run))
        + " a run; in total "
        + _span(
            _hours(gpu_hours(cost.flops_min, mfu, peak_tflops)), _hours(gpu_hours(cost.flops_max, mfu, peak_tflops))
        ),
    ]
    if setup.settings.accelerator == "cpu":
        if probe is None:
            lines.append("CPU time: unknown (no probe; --probe-steps N times N training steps of the first run)")
        else:
            low = probe.seconds_per_step * cost.steps_min / workers
            high = probe.seconds_per_step * cost.steps_max / workers
            lines.append(
                f"CPU time at the probe's pace with {workers} worker(s): {_span(_duration(low), _duration(high))} "
                "of training steps (each run's setup, first compile, validation and measurements come on top)"
            )
    lines += ["", "assumptions:"]
    lines.append(
        f"  MFU {mfu:.0%} (--mfu); peak {peak_tflops:g} TFLOP/s (--peak-tflops; default {DEFAULT_PEAK_TFLOPS:g}: "
        "H100 SXM, bf16, dense); FLOPs count matmuls only (norms, validation, depth statistics excluded)"
    )
    if probe is not None:
        load = ", ".join(f"{v:.2f}" for v in probe.loadavg)
        lines.append(
            f"  CPU probe: {probe.label}, {probe.steps} step(s) timed after a warm-up step of "
            f"{probe.warmup_seconds:.1f} s: {probe.seconds_per_step:.3f} s a step, {probe.threads} torch thread(s); "
            f"load average {load} (1, 5, 15 min)"
        )
    elif setup.settings.accelerator == "cpu":
        lines.append("  CPU probe: none (--probe-steps 0)")
    return "\n".join(lines)


def _size_lines(sizes: Sequence[RunSize]) -> list[str]:
    """The parameter counts, T/P and, past one pass over the training data, its epochs: one line per model shape."""
    where = "(bhyt_pl/model_size.py)"
    if len(sizes) == 1:
        return [f"parameters {where}: {sizes[0].text()}"]
    return [f"parameters at {size.n_layers} layers {where}: {size.text()}" for size in sizes]


def _config(spec: RunSpec) -> LlamaConfig:
    return LlamaConfig.from_name(spec.preset, **spec.overrides)


def _first_spec(setup: StudySetup) -> RunSpec:
    """The run the study trains first: the first group's first selection run (the sweep's first grid cell)."""
    if setup.sweep:
        return _specs_for_flops(setup)[0]
    return selection_specs(setup.groups[0], setup.budget.lrs, setup.base)[0]


def dry_run(setup: StudySetup, workers: int = 1) -> int:
    """``--dry-run``: check the options, probe the CPU pace (``--probe-steps``; CPU only), print the estimate for
    ``workers`` runs at once; 0 on success. Trains no run and makes no folder."""
    args = setup.options
    check_arguments(args)
    probe = None
    if setup.settings.accelerator == "cpu" and args.probe_steps > 0:
        threads = 1 if workers > 1 else args.threads
        probe = probe_pace(_first_spec(setup), setup.data, args.probe_steps, setup.settings.compile, threads)
    print(dry_run_text(setup, args.mfu, args.peak_tflops, probe, workers))
    return 0

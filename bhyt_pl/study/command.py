"""``python -m bhyt_pl study``: the depth study and the stability sweep (docs/depth_study.md).

Depth study (default, protocol v3 of ``bhyt_pl.study.plan``): every ``--schemes`` group picks its
candidate and learning rate on a selection seed (``--lrs``, extended past an edge up to ``--extensions``
times), then trains ``--seeds`` evaluation seeds at that best rate and at each ``--matched-lrs`` rate.
Writes ``report.md`` (claims from the ``bhyt_pl.study.claims`` table with per-claim and Holm-adjusted
verdicts, claims over training, depth-wise growth, per-group tables, LR sensitivity, layer importance,
StabilityMonitor columns), figures, ``results.json`` (every run, the design, every claim with its run labels)
and one ``runs/<label>/`` folder per run. Runs are reused: a run whose ``result.json`` matches its spec
(across invocations sharing ``--out``) is read back instead of retrained.

Stability sweep (``--sweep``): schemes x ``--depths`` x ``--lrs`` x seeds; ``report.md`` with the grid.

Examples::

    python -m bhyt_pl study --quick --workers 2           # at most 10 minutes on 2 CPU cores
    python -m bhyt_pl study --workers 2                   # the committed report (docs/depth_study.md)
    python -m bhyt_pl study --sweep --quick               # small stability grid
    python -m bhyt_pl study --schemes rmsnorm "bhyt:lambda_attn=1.0|2.0" --seeds 5 --lrs 1e-3 3e-3
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.config import PRESETS, LlamaConfig
from bhyt_pl.study import report
from bhyt_pl.study.design import StudyDesign, check_disjoint, parse_group
from bhyt_pl.study.plan import default_matched_lrs, evaluation_specs, select, selection_specs, sweep_specs
from bhyt_pl.study.results import StudyRecord, load
from bhyt_pl.study.runner import RunResult, RunSpec, TrainerSettings, run_dirname, run_one
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "DEFAULT_ROLES",
    "DEFAULT_SCHEMES",
    "FULL",
    "QUICK",
    "REMOVED_FLAGS",
    "SWEEP",
    "SWEEP_QUICK",
    "Budget",
    "main",
    "parser",
]

log = logging.getLogger(__name__)

DEFAULT_SCHEMES = (
    "rmsnorm",
    "layernorm",
    "lns",
    "peri_ln",
    "dyt:alpha_attn=0.5|1.0|2.0",
    "bhyt",
    "bhyt:lambda_attn=1.0",
    "bhyt:exact_layers=4",
    "bhyt_exact",
)
"""``rmsnorm`` is the reference; DyT over an alpha grid (its width-dependent alpha is untuned here); BHyT
at lambda_attn 2 (released default) and 1 (the paper's text); BHyT with exact statistics in the first 4
layers (the approximation ablation); BHyT* (exact everywhere). Any other registered scheme (``derf``,
``dyisru``, ``seednorm``, ``post_ln``, ``mix_ln``, ``reordered``, ``hybridnorm``, ``ssnorm``, ``gpas``, your own)
runs with ``--schemes``."""

DEFAULT_ROLES = {
    "BHyT": "bhyt",
    "BHyT lambda_attn 1": "bhyt:lambda_attn=1.0",
    "BHyT exact 4 layers": "bhyt:exact_layers=4",
    "BHyT*": "bhyt_exact",
    "RMSNorm": "rmsnorm",
    "LayerNorm": "layernorm",
    "LNS": "lns",
    "Peri-LN": "peri_ln",
    "DyT": "dyt:alpha_attn=0.5|1.0|2.0",
}
"""The roles of the claims table (``bhyt_pl.study.claims``) and the default group each plays; ``--roles
ROLE=GROUP`` remaps one (e.g. ``--roles DyT=dyt:alpha_attn=1.0``). A claim whose roles have no group is listed
as not tested."""

REMOVED_FLAGS = {
    "--seed": "--seeds N (evaluation seeds 43..42+N after the selection seed 42; each seeds the initialisation "
    "and the data order)",
    "--data-seed": "--seeds N (seed i shuffles the data with 42 + i)",
    "--lr": "--lrs LR [LR ...] (the learning-rate grid; one value: that learning rate for every scheme)",
}
"""Flags of study v1 and what replaces them (a removed flag is an error naming its replacement)."""


@dataclass(frozen=True)
class Budget:
    """The defaults of one mode; every field can be overridden on the command line."""

    preset: str
    layers: int | None
    steps: int
    seq_len: int
    batch_size: int
    val_batches: int
    lrs: tuple[float, ...]
    seeds: int
    trajectory_every: int
    depths: tuple[int, ...] = ()
    extensions: int = 1


# Protocol v3 run counts with the default 9 groups (docs/depth_study.md): 33 selection runs (8 schemes + 3 DyT
# alphas, x 3 lrs) + one extension per group whose best rate sits at a grid edge (at most 9) + 3 evaluation
# seeds x (best rate + 2 matched rates, coinciding where the best rate is a matched one): 33 + <=9 + 27..81.
# Measured on 2 CPU cores: 3 extensions, matched rates 1e-3 and 3e-3 (LNS diverges at 1e-2), 96 runs at about
# 55 s a run with 2 workers (88-91 min); the committed run took the protocol's first cut, one matched rate
# (--matched-lrs 3e-3): 72 runs in 66 min.
# --quick: 8 layers, 40 steps, 2 lrs (both matched), 2 evaluation seeds, no extension: 22 + 36 = 58 short runs.
FULL = Budget("deep-32x128", None, 180, 64, 8, 4, (1e-3, 3e-3, 1e-2), 3, 20)
QUICK = Budget("deep-32x128", 8, 40, 64, 8, 4, (3e-3, 1e-2), 2, 10, extensions=0)
# lr 1e-2 trains and 1e-1 diverges for most schemes within 40 steps (docs/depth_study.md): the grids straddle it
SWEEP = Budget("deep-32x128", None, 100, 64, 8, 2, (1e-2, 3e-2, 1e-1), 1, 0, depths=(8, 16, 32, 64))
SWEEP_QUICK = Budget("deep-32x128", None, 40, 64, 4, 1, (1e-2, 1e-1, 1.0), 1, 0, depths=(4, 16))


COMPILE_DEFAULT = True
"""Study runs compile each block unless ``--no-compile``: a default run (180 steps) took 0.74x the eager run's
wall time on 2 CPU cores, the first compile included (docs/performance.md, "Study run")."""


class _Removed(argparse.Action):
    """A removed flag: parsing fails with the name of its replacement."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser.error(f"{option_string} was removed; use {REMOVED_FLAGS[option_string]}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bhyt_pl study",
        description="Train every norm scheme over seeds with its own learning rate (chosen from --lrs by "
        "validation loss on the selection seed, which no evaluation seed reuses) and report claims with seed-paired "
        "95% intervals, depth trajectories, stability columns, LR sensitivity and layer importance (--sweep: "
        "stability grid over depth x LR).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mode = p.add_argument_group("mode")
    mode.add_argument("--quick", action="store_true", help="small budget (at most 10 minutes on 2 CPU cores)")
    mode.add_argument("--sweep", action="store_true", help="stability sweep: schemes x --depths x --lrs x --seeds")
    model = p.add_argument_group("model and budget (unset: the mode's default, see docs/depth_study.md)")
    model.add_argument("--preset", choices=sorted(PRESETS), default=None, help=f"model preset; default {FULL.preset}")
    model.add_argument("--layers", type=int, default=None, help="override the preset's n_layers (not with --sweep)")
    model.add_argument(
        "--override", nargs="*", default=[], metavar="FIELD=VALUE", help="other LlamaConfig fields, e.g. dim=256"
    )
    model.add_argument(
        "--schemes",
        nargs="+",
        default=list(DEFAULT_SCHEMES),
        help="scheme groups, each name[:key=value,...] for any registered scheme; key=v1|v2 is a grid searched "
        "on the selection seed with the learning rate (e.g. dyt:alpha_attn=0.5|1.0)",
    )
    model.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run; default {FULL.steps}")
    model.add_argument(
        "--lrs", type=float, nargs="+", default=None, help=f"learning-rate grid; default {' '.join(map(str, FULL.lrs))}"
    )
    model.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"evaluation seeds per scheme and rate (init and data order; the selection seed is another one); "
        f"default {FULL.seeds} (--quick: {QUICK.seeds}; --sweep: seeds per grid cell, {SWEEP.seeds})",
    )
    model.add_argument(
        "--extensions",
        type=int,
        default=None,
        help=f"grid steps a group may add past an edge of --lrs where its best rate sits; default {FULL.extensions} "
        f"(--quick: {QUICK.extensions})",
    )
    model.add_argument(
        "--matched-lrs",
        type=float,
        nargs="+",
        default=None,
        help="rates every group trains at with the evaluation seeds (depth claims); default: the two highest --lrs "
        "rates at which every group trained on the selection seed",
    )
    model.add_argument(
        "--roles",
        nargs="*",
        default=[],
        metavar="ROLE=GROUP",
        help="map a claim role to a --schemes group (defaults: "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_ROLES.items())
        + ")",
    )
    model.add_argument("--depths", type=int, nargs="+", default=None, help=f"sweep depths; default {SWEEP.depths}")
    model.add_argument(
        "--warmup-ratio",
        type=float,
        default=None,
        help="linear warmup fraction of the steps; default the scheme's recipe (nGPT: none), else 0.05",
    )
    model.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="AdamW weight decay (matrices only); default the scheme's recipe (nGPT: 0), else 0.1",
    )
    model.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip")
    model.add_argument(
        "--max-loss",
        type=float,
        default=None,
        help="divergence bound on the training loss (NaN/inf always diverges); default 1.5 * ln(vocab_size)",
    )
    model.add_argument(
        "--trajectory-every",
        type=int,
        default=None,
        help=f"depth statistics every N steps (0: init and end only); default {FULL.trajectory_every}",
    )
    model.add_argument("--no-importance", action="store_true", help="skip the layer-importance measurement")
    data = p.add_argument_group("data (C4DataModule)")
    data.add_argument(
        "--data-files",
        default="embedded",
        help="C4-format shards: 'embedded' (bundled corpus), a directory or glob; 'none' streams --data-path",
    )
    data.add_argument("--data-path", default="allenai/c4", help="Hub dataset when --data-files none")
    data.add_argument("--tokenizer", default="embedded", help="'embedded', a tokenizer.json path or a Hub name")
    data.add_argument("--seq-len", type=int, default=None, help=f"training sequence length; default {FULL.seq_len}")
    data.add_argument("--batch-size", type=int, default=None, help=f"sequences per step; default {FULL.batch_size}")
    data.add_argument(
        "--val-batches",
        type=int,
        default=None,
        help=f"fixed validation batches: validation loss and depth statistics (at least 4); default {FULL.val_batches}",
    )
    data.add_argument("--shuffle-buffer", type=int, default=1000, help="documents in the streaming shuffle buffer")
    data.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    hw = p.add_argument_group("hardware (L.Trainer)")
    hw.add_argument("--accelerator", default="cpu", help="cpu, gpu, auto, ...")
    hw.add_argument("--devices", default="1", help="devices per run; more than 1: launch with torchrun")
    hw.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, ...")
    hw.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="runs in parallel, one process with one torch thread each; default: the CPUs this process may use "
        "(CPU: at most the physical cores); 1: runs one after another in this process",
    )
    hw.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=COMPILE_DEFAULT,
        help="torch.compile each block of every run; --no-compile: eager, as study v2 ran (docs/performance.md, "
        "'Study run': speed-up and how far the losses may differ)",
    )
    hw.add_argument("--threads", type=int, default=None, help="torch CPU threads with --workers 1 (default: torch's)")
    hw.add_argument("--progress-bar", action="store_true", help="show Lightning's progress bar")
    p.add_argument("--out", type=Path, default=None, help="report folder; default runs/study[-sweep][-quick]")
    p.add_argument("--restart", action="store_true", help="retrain every run (default: resume, reusing finished runs)")
    p.add_argument(
        "--report-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="rebuild DIR/report.md and its figures from DIR/results.json alone (no training, no run folders); "
        "every other option is ignored",
    )
    for flag in REMOVED_FLAGS:
        p.add_argument(flag, action=_Removed, help=argparse.SUPPRESS)
    return p


def default_workers() -> int:
    """The CPUs this process may run on (its affinity, which containers and ``taskset`` narrow), one run each."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--override {item!r} must be FIELD=VALUE, e.g. --override dim=256")
        overrides[key] = _literal(value)
    return overrides


def resolve(args: argparse.Namespace) -> tuple[Budget, dict[str, Any]]:
    """The budget (mode defaults, then explicit options) and the model overrides; fails early on bad values."""
    base = (SWEEP_QUICK if args.quick else SWEEP) if args.sweep else (QUICK if args.quick else FULL)

    def pick(name: str, value: Any) -> Any:
        return value if value is not None else getattr(base, name)

    budget = Budget(
        preset=args.preset or base.preset,
        layers=pick("layers", args.layers),
        steps=pick("steps", args.steps),
        seq_len=pick("seq_len", args.seq_len),
        batch_size=pick("batch_size", args.batch_size),
        val_batches=pick("val_batches", args.val_batches),
        lrs=tuple(args.lrs) if args.lrs else base.lrs,
        seeds=pick("seeds", args.seeds),
        trajectory_every=pick("trajectory_every", args.trajectory_every),
        depths=tuple(args.depths) if args.depths else base.depths,
        extensions=pick("extensions", args.extensions),
    )
    problems = []
    for name in ("steps", "seq_len", "batch_size", "val_batches", "seeds"):
        if getattr(budget, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(budget, name)}")
    if not args.sweep and budget.val_batches < 4:
        problems.append(f"--val-batches must be >= 4 (depth statistics need 4 batches), got {budget.val_batches}")
    if budget.extensions < 0:
        problems.append(f"--extensions must be >= 0, got {budget.extensions}")
    if args.matched_lrs is not None and any(not lr > 0 for lr in args.matched_lrs):
        problems.append(f"--matched-lrs must be > 0, got {args.matched_lrs}")
    if args.matched_lrs is not None and len(set(args.matched_lrs)) != len(args.matched_lrs):
        problems.append(f"--matched-lrs has duplicates (each would be tested twice): {args.matched_lrs}")
    for item in args.roles:
        if "=" not in item:
            problems.append(f"--roles {item!r} must be ROLE=GROUP, e.g. --roles DyT=dyt:alpha_attn=1.0")
    if budget.trajectory_every < 0:
        problems.append(f"--trajectory-every must be >= 0, got {budget.trajectory_every}")
    if args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if budget.layers is not None and budget.layers < 1:
        problems.append(f"--layers must be >= 1, got {budget.layers}")
    if args.sweep and args.layers is not None:
        problems.append("--layers does not apply to --sweep; give the depths with --depths")
    if args.sweep and any(d < 1 for d in budget.depths):
        problems.append(f"--depths must be >= 1, got {budget.depths}")
    if any(not lr > 0 for lr in budget.lrs):
        problems.append(f"--lrs must be > 0, got {budget.lrs}")
    if len(set(budget.lrs)) != len(budget.lrs):
        problems.append(f"--lrs has duplicates: {budget.lrs}")
    if args.max_loss is not None and not args.max_loss > 0:
        problems.append(f"--max-loss must be > 0, got {args.max_loss}")
    overrides: dict[str, Any] = {}
    try:
        overrides = _parse_overrides(args.override)
    except ValueError as exc:
        problems.append(str(exc))
    if budget.layers is not None and not args.sweep:
        overrides["n_layers"] = budget.layers
    raise_if_problems("study arguments", problems)
    config = LlamaConfig.from_name(budget.preset, **overrides)  # unknown fields and bad values fail here
    if budget.seq_len > config.max_seq_len:
        raise ValueError(
            f"--seq-len {budget.seq_len} exceeds the preset's max_seq_len={config.max_seq_len}; "
            f"raise it with --override max_seq_len={budget.seq_len}"
        )
    return budget, overrides


def make_datamodule(args: argparse.Namespace, budget: Budget, data_seed: int):  # -> C4DataModule
    """A fresh ``C4DataModule`` with the study's data and shapes, shuffled with ``data_seed``."""
    from bhyt_pl.data import C4DataModule

    data_files = None if str(args.data_files).lower() == "none" else args.data_files
    return C4DataModule(
        path=args.data_path,
        data_files=data_files,
        tokenizer=args.tokenizer,
        seq_len=budget.seq_len,
        batch_size=budget.batch_size,
        num_workers=args.num_workers,
        shuffle_buffer=args.shuffle_buffer,
        seed=data_seed,
    )


def fixed_batches(datamodule: Any, count: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` validation batches (training batches when the source has no validation split):
    the same tensors for every run: depth statistics and the validation loss use all of them, layer importance
    the first."""
    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    if isinstance(loader, list):  # C4DataModule returns [] without a validation split
        log.warning("the data source has no validation split: validating on the first training batches")
        loader = datamodule.train_dataloader()
    batches = []
    for batch in loader:
        batches.append({"input_ids": batch["input_ids"].clone(), "labels": batch["labels"].clone()})
        if len(batches) == count:
            break
    if not batches:
        raise ValueError("the data source yielded no batch for validation and depth statistics")
    return batches


# ----------------------------------------------------------------------------- running
def finished_result(out: Path, spec: RunSpec) -> RunResult | None:
    """The run's stored result when it finished (ok or diverged) with exactly this spec, else None (resume)."""
    path = out / "runs" / run_dirname(spec.label) / "result.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("status") not in ("ok", "diverged"):
            return None
        if stored["spec"] != json.loads(json.dumps(asdict(spec), default=str)):
            return None
        return RunResult.from_dict(stored)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _init_worker() -> None:
    torch.set_num_threads(1)  # one thread per process: --workers processes share the cores without oversubscription
    logging.basicConfig(level=logging.WARNING, format="%(message)s")


class _InlineExecutor(Executor):
    """Runs each submitted call at once in this process (``--workers 1``): same loop, no pickling."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class Scheduler:
    """Submits runs to an executor, reusing finished ones (resume), and hands results back as they finish; a run
    whose label was submitted before is not submitted again (the two arms of the protocol share runs)."""

    def __init__(self, executor: Executor, run: Callable[[RunSpec], RunResult], out: Path, resume: bool) -> None:
        self.executor, self.run, self.out, self.resume = executor, run, out, resume
        self.pending: dict[Future, RunSpec] = {}
        self.reused: list[str] = []
        self.labels: set[str] = set()  # runs handed to this scheduler so far, reused ones included

    @property
    def submitted(self) -> int:
        return len(self.labels)

    def submit(self, specs: Iterable[RunSpec]) -> list[RunSpec]:
        """Submits the specs not submitted before and returns them."""
        fresh = []
        for spec in specs:
            if spec.label in self.labels:
                continue
            self.labels.add(spec.label)
            fresh.append(spec)
            stored = finished_result(self.out, spec) if self.resume else None
            if stored is not None:
                self.reused.append(spec.label)
                future: Future = Future()
                future.set_result(stored)
            else:
                log.info("study run: %s", spec.label)
                future = self.executor.submit(self.run, spec)
            self.pending[future] = spec
        return fresh

    def finished(self) -> Iterable[RunResult]:
        """Yields results until nothing is pending (callers may submit more while iterating)."""
        while self.pending:
            done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
            for future in [f for f in self.pending if f in done]:  # in submission order: deterministic reports
                spec = self.pending.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # noqa: BLE001 - a crashed worker is one failed run
                    result = RunResult(spec=spec, status="error", error=f"{type(exc).__name__}: {exc}")
                yield result


def progress_line(done: int, total: int, elapsed: float, reused: int = 0, final: bool = True) -> str:
    """``run k of N`` and the time left, from this invocation's pace (runs reused from a previous one take
    no time, so they are left out of the pace). ``final=False`` while the protocol may still add runs (grid
    extensions, the matched arm): ``N`` and the time left are then lower bounds and say so."""
    line = f"study: run {done} of {'' if final else 'at least '}{total} done"
    fresh = done - reused
    if done < total and fresh > 0:
        left = elapsed / fresh * (total - done)
        line += f"; about {left / 60:.1f} min left" if left >= 60 else f"; about {left:.0f} s left"
        line += "" if final else " (at least)"
    return line


def run_depth_study(
    design: StudyDesign,
    base: RunSpec,
    scheduler: Scheduler,
    on_result: Callable[[RunResult], None] = lambda r: None,
    matched_lrs: Sequence[float] | None = None,
) -> list[RunResult]:
    """Protocol v3 (``bhyt_pl.study.plan``) over ``design``'s groups, grid and seeds: selection runs on the
    selection seed, a group's extension runs as soon as its selection finds its best rate at an edge, its
    best-rate evaluation seeds as soon as its selection is complete, and the matched arm (``matched_lrs``, else
    the default rule) once every group's is (runs of both arms train once). ``design``'s selections and matched
    rates are filled in place, so a report written meanwhile sees them."""
    groups, lrs = design.groups, design.lrs
    check_disjoint(groups)  # a candidate in two groups would share run labels and one group would never finish
    pending: dict[str, set[str]] = {}
    selection_runs: dict[str, list[RunResult]] = {g.label: [] for g in groups}
    by_label: dict[str, RunResult] = {}

    for g in groups:
        pending[g.label] = {s.label for s in scheduler.submit(selection_specs(g, lrs, base))}
    for result in scheduler.finished():
        by_label[result.spec.label] = result
        on_result(result)
        group = result.spec.group
        if result.spec.label not in pending.get(group, ()):
            continue
        selection_runs[group].append(result)
        pending[group].discard(result.spec.label)
        if pending[group]:
            continue
        step = select(design.group(group), selection_runs[group], lrs, design.extensions, base)
        if isinstance(step, RunSpec):  # the best rate sits at an edge: one more grid step for its candidate
            pending[group] = {s.label for s in scheduler.submit([step])}
            continue
        design.selections[group] = step
        scheduler.submit(evaluation_specs(design.group(group), step, (), design.n_seeds, base))
        if design.complete:  # every group selected: the matched arm
            ordered = [design.selections[g.label] for g in groups]
            if matched_lrs is not None:
                design.matched_lrs = tuple(sorted(matched_lrs))
                design.matched_note = "given with --matched-lrs"
            else:
                design.matched_lrs = default_matched_lrs(ordered, lrs)
                design.matched_note = (
                    "the two highest --lrs rates at which every group's kept candidate trained on the selection seed"
                    + ("" if len(design.matched_lrs) == 2 else f" (only {len(design.matched_lrs)} qualified)")
                )
            for g in groups:
                specs = evaluation_specs(g, design.selections[g.label], design.matched_lrs, design.n_seeds, base)
                scheduler.submit(specs)
    group_order = {g.label: i for i, g in enumerate(groups)}
    return sorted(
        by_label.values(),
        key=lambda r: (group_order[r.spec.group], r.spec.seed_index, r.spec.candidate, r.spec.lr),
    )


def base_spec(args: argparse.Namespace, budget: Budget, overrides: dict[str, Any]) -> RunSpec:
    """The settings every run of one study invocation shares (each run then sets its scheme, rate and seed):
    ``main``'s runs, and the run ``python -m bhyt_pl bench --parts study_run`` times."""
    config = LlamaConfig.from_name(budget.preset, **overrides)
    return RunSpec(
        label="base",
        norm="rmsnorm",
        preset=budget.preset,
        overrides=overrides,
        lr=budget.lrs[0],
        steps=budget.steps,
        seed=42,
        data_seed=42,
        max_loss=args.max_loss if args.max_loss is not None else 1.5 * math.log(config.vocab_size),
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        trajectory_every=0 if args.sweep else budget.trajectory_every,
        stability_every=0 if args.sweep else max(1, budget.trajectory_every or budget.steps),
        spike_window=max(2, min(32, budget.steps // 4)),
        importance=not (args.sweep or args.no_importance),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the study; 0 when every run finished or diverged (a result), 1 when a run failed with an error."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from bhyt_pl.machine import machine_info

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed the message
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.report_from is not None:
        try:
            paths = report_from(args.report_from)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        log.info("report rebuilt from %s: %s", paths["results"], paths["report"])
        return 0
    try:
        budget, overrides = resolve(args)
        groups = [parse_group(s) for s in args.schemes]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        print(f"error: --schemes has duplicates: {labels}", file=sys.stderr)
        return 2
    try:
        check_disjoint(groups)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    roles = dict(DEFAULT_ROLES)
    for item in args.roles:
        role, _, group = item.partition("=")
        if role not in DEFAULT_ROLES or group not in labels:
            print(
                f"error: --roles {item!r}: ROLE must be one of {sorted(DEFAULT_ROLES)} and GROUP one of {labels}",
                file=sys.stderr,
            )
            return 2
        roles[role] = group
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    mode = "study" + ("-sweep" if args.sweep else "") + ("-quick" if args.quick else "")
    out: Path = args.out if args.out is not None else Path("runs") / mode
    config = LlamaConfig.from_name(budget.preset, **overrides)
    base = base_spec(args, budget, overrides)
    max_loss = base.max_loss
    devices: int | str = int(args.devices) if str(args.devices).isdigit() else args.devices
    settings = TrainerSettings(
        args.accelerator, devices, args.precision, progress_bar=args.progress_bar, compile=args.compile
    )
    factory = partial(make_datamodule, args, budget)
    meta: dict[str, Any] = {
        "command": "python -m bhyt_pl study " + shlex.join(argv),
        "mode": mode,
        "preset": budget.preset,
        "n_layers_label": "/".join(map(str, budget.depths)) if args.sweep else str(config.n_layers),
        "overrides": overrides,
        "steps": budget.steps,
        "seq_len": budget.seq_len,
        "batch_size": budget.batch_size,
        "tokens_per_step": budget.seq_len * budget.batch_size,
        "tokens_per_run": budget.seq_len * budget.batch_size * budget.steps,
        "lrs": list(budget.lrs),
        "seeds": budget.seeds,
        "selection_seed": "index 0 (seed 42); evaluation seeds: indices 1..N (seeds 43..42+N)",
        "extensions": budget.extensions,
        "roles": {k: v for k, v in roles.items() if v in labels},
        "schemes": labels,
        "trajectory_every": base.trajectory_every,
        "workers": args.workers,
        "compile": args.compile,
        "data": f"{args.data_files} (tokenizer {args.tokenizer})",
        "validation": f"{budget.val_batches} fixed batches of {budget.batch_size} x {budget.seq_len}: validation "
        "loss and depth statistics at every trajectory point",
        "unigram_loss": None,
        "max_loss": round(max_loss, 4),
        "loadavg_at_start": _loadavg(),
        "machine": machine_info(torch.device("cuda" if args.accelerator in ("gpu", "cuda") else "cpu")),
    }
    started = time.perf_counter()
    batches = fixed_batches(factory(base.data_seed), budget.val_batches)
    meta["unigram_loss"] = round(unigram_entropy(factory(base.data_seed), batches, 32, config.vocab_size), 4)
    run = partial(_run, factory=factory, batches=batches, settings=settings, out=out, threads=args.workers > 1)
    executor: Executor = (
        _InlineExecutor()
        if args.workers == 1
        else ProcessPoolExecutor(args.workers, mp_context=_spawn(), initializer=_init_worker)
    )
    scheduler = Scheduler(executor, run, out, resume=not args.restart)
    results: list[RunResult] = []
    design = None if args.sweep else StudyDesign(tuple(groups), budget.lrs, budget.seeds, budget.extensions)
    record = StudyRecord(meta, results, design)

    def on_result(result: RunResult) -> None:
        results.append(result)
        elapsed = time.perf_counter() - started
        # v3 plans as it goes (extensions, then the matched arm once every group is selected): the count is
        # final for a sweep, and for the study once every group's selection is done
        final = design is None or design.complete
        log.info(progress_line(len(results), scheduler.submitted, elapsed, len(scheduler.reused), final))
        log.info(
            "  %s: %s, train loss %.4f, val loss %.4f, %.0f s",
            result.spec.label,
            result.status,
            result.train_loss,
            result.val_loss,
            result.wall_seconds,
        )
        meta["wall_seconds"] = round(time.perf_counter() - started, 1)
        if rank_zero_only.rank == 0:  # tables after every run: an interrupted study keeps what it measured
            report.write_report(out, record, figures=False)

    try:
        with executor:
            if args.sweep:
                specs = sweep_specs(groups, budget.depths, budget.lrs, budget.seeds, base)
                scheduler.submit(specs)
                for result in scheduler.finished():
                    on_result(result)
                order = {spec.label: i for i, spec in enumerate(specs)}
                results.sort(key=lambda r: order[r.spec.label])
            else:
                results[:] = run_depth_study(design, base, scheduler, on_result, matched_lrs=args.matched_lrs)
    finally:  # figures once, at the end or on an interrupt, for the runs that finished
        meta["wall_seconds"] = round(time.perf_counter() - started, 1)
        meta["runs_reused"] = len(scheduler.reused)
        meta["loadavg_at_end"] = _loadavg()
        if rank_zero_only.rank == 0 and results:
            paths = report.write_report(out, record)
            log.info("study finished in %.0f s; report: %s", meta["wall_seconds"], paths["report"])
    return 1 if any(r.status == "error" for r in results) else 0


def report_from(folder: Path, figures: bool = True) -> dict[str, Path]:
    """``report.md`` and (``figures``) the figures of a finished study, rebuilt from ``folder/results.json`` alone
    (which is read, not written)."""
    try:
        record = load(folder)
    except ValueError as exc:
        raise ValueError(f"--report-from {str(folder)!r}: {exc}") from exc
    return report.write_report(folder, record, figures=figures, save=False)


def _run(
    spec: RunSpec,
    factory: Callable[[int], Any],
    batches: list[dict[str, torch.Tensor]],
    settings: TrainerSettings,
    out: Path,
    threads: bool,
) -> RunResult:
    if threads:
        torch.set_num_threads(1)
    return run_one(spec, factory, batches, settings, out)


def _spawn():
    import multiprocessing

    return multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def unigram_entropy(
    datamodule: Any, val_batches: list[dict[str, torch.Tensor]], train_batches: int, vocab_size: int
) -> float:
    """Cross-entropy (nats) of the validation tokens under the unigram distribution of ``train_batches``
    training batches (add-one smoothing): the loss a model reaches by learning token frequencies only."""
    datamodule.setup("fit")
    counts: dict[int, int] = {}
    for i, batch in enumerate(datamodule.train_dataloader()):
        labels = batch["labels"][batch["labels"] != -100]
        for token, n in zip(*torch.unique(labels, return_counts=True), strict=True):
            counts[int(token)] = counts.get(int(token), 0) + int(n)
        if i + 1 >= train_batches:
            break
    total = sum(counts.values()) + vocab_size
    nll, n = 0.0, 0
    for batch in val_batches:
        labels = batch["labels"][batch["labels"] != -100].tolist()
        nll += sum(-math.log((counts.get(t, 0) + 1) / total) for t in labels)
        n += len(labels)
    return nll / max(n, 1)

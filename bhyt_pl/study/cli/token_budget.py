"""``python -m bhyt_pl study token-budget``: the map of schemes across tokens per parameter (docs/token_budget.md).

Every scheme group trains at each budget (``--budgets``, T/P on the block matrices) a full run with its own schedule;
its rate is chosen per budget on the selection seed (protocol v3's selection, with the group's own grid:
``--lrs``, ``--scheme-lrs``), and ``--seeds`` evaluation seeds then train at that rate. The report gives, per budget,
each scheme's validation-loss difference to ``--reference`` with its paired-t interval and minimum detectable
difference, the train-validation gap, the depth claims' three arms, tanh saturation, the crossover in ln T/P and
the early-saturation rule's score (``bhyt_pl.study.protocol.token_budget_effects``).

Examples::

    python -m bhyt_pl study token-budget --dry-run --workers 2     # runs, steps, GPU-hours per budget, CPU time
    python -m bhyt_pl study token-budget --workers 2               # the committed map (docs/token_budget.md)
    python -m bhyt_pl study --report-from docs/token_budget         # its report again, no training
    python -m bhyt_pl study token-budget --config recipes/study/token-budget-374m.yaml --dry-run
"""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bhyt_pl.config import PRESETS, LlamaConfig
from bhyt_pl.errors import UsageError
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.model_size import block_params
from bhyt_pl.study.cli import estimate
from bhyt_pl.study.cli.kinds import OnResult, PreparedStudy, StudyKind, register_kind
from bhyt_pl.study.cli.run_arguments import (
    add_data_arguments,
    add_hardware_arguments,
    add_schedule_arguments,
    parse_overrides,
    study_data,
    trainer_settings,
)
from bhyt_pl.study.cli.setup import StudyOptions, loadavg_text
from bhyt_pl.study.launch.execution import run_token_budget
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.design import SchemeGroup, check_disjoint, parse_group, rate_key
from bhyt_pl.study.protocol.plan import evaluation_specs, select, selection_specs
from bhyt_pl.study.protocol.size import run_sizes
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, TrainerSettings
from bhyt_pl.study.protocol.token_budget import BudgetDesign, budget_base, token_budgets
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.report import token_budget as report
from bhyt_pl.study.run.data import StudyData, unigram_loss_recorder
from bhyt_pl.validation import raise_if_problems

__all__ = ["DEFAULTS", "TOKEN_BUDGET", "BudgetSetup", "TokenBudgetKind", "TokenBudgetDefaults"]


@dataclass(frozen=True)
class TokenBudgetDefaults:
    """The committed map's settings (docs/token_budget.md); every one is an option."""

    preset: str = "deep-16x64"
    schemes: tuple[str, ...] = ("rmsnorm", "bhyt", "bhyt_exact", "dyt:alpha_attn=0.5")
    reference: str = "rmsnorm"
    budgets: tuple[float, ...] = (0.015, 0.043, 0.12, 0.35, 1.0)
    lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    scheme_lrs: tuple[str, ...] = ("dyt:alpha_attn=0.5=3e-5,1e-4,3e-4",)
    seeds: int = 4
    extensions: int = 1
    seq_len: int = 64
    batch_size: int = 8
    val_batches: int = 16


DEFAULTS = TokenBudgetDefaults()
"""DyT's grid sits lower: in the depth study its best rate was the lowest tried (3.3e-4), where it barely trained.
Four evaluation seeds: at the paired SD of the validation-loss difference BHyT - RMSNorm the confirmation measured
(0.165 nats, 13 pairs) a paired t-test detects 0.35 nats at 80 % power with 4 pairs (3: 0.54; 5: 0.28), and 4 is
what fits 90 minutes on 2 CPU cores with selection at every budget (docs/method.md, section 11)."""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    model = p.add_argument_group("the map")
    model.add_argument("--preset", choices=sorted(PRESETS), default=d.preset, help="model preset")
    model.add_argument(
        "--override", nargs="*", default=[], metavar="FIELD=VALUE", help="LlamaConfig fields, e.g. n_layers=8"
    )
    model.add_argument(
        "--schemes", nargs="+", default=list(d.schemes), help="scheme groups, each name[:key=value,...] (a grid "
        "key=v1|v2 is searched on the selection seed with the rate)"
    )  # fmt: skip
    model.add_argument("--reference", default=d.reference, help="the group every loss difference is taken against")
    model.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=list(d.budgets),
        help="training tokens per block-matrix parameter (T/P), one full run with its own schedule each",
    )
    model.add_argument("--lrs", type=float, nargs="+", default=list(d.lrs), help="every group's learning-rate grid")
    model.add_argument(
        "--scheme-lrs",
        nargs="*",
        default=None,
        metavar="GROUP=LR,LR,...",
        help=f"a group's own grid instead of --lrs (default: {' '.join(d.scheme_lrs)}, for the groups among --schemes)",
    )
    model.add_argument(
        "--select-through",
        type=int,
        default=None,
        help="select rates on the N smallest budgets only; each larger one inherits the largest of those's rate "
        "(default: every budget selects)",
    )
    model.add_argument("--seeds", type=int, default=d.seeds, help="evaluation seeds per group and budget")
    model.add_argument(
        "--extensions", type=int, default=d.extensions, help="grid steps a group may add past an edge, per budget"
    )
    add_schedule_arguments(model)
    add_data_arguments(p, d.seq_len, d.batch_size, d.val_batches)
    add_hardware_arguments(p)
    estimate.add_arguments(p)


def _grids(groups: Sequence[SchemeGroup], lrs: Sequence[float], items: Sequence[str]) -> dict[str, tuple[float, ...]]:
    grids = {g.label: tuple(lrs) for g in groups}
    for item in items:
        group, eq, text = item.rpartition("=")
        if not eq or group not in grids:
            raise UsageError(f"--scheme-lrs {item!r}: must be GROUP=LR,LR,... with GROUP one of {sorted(grids)}")
        try:
            rates = tuple(float(x) for x in text.split(","))
        except ValueError:
            raise UsageError(f"--scheme-lrs {item!r}: the rates must be numbers, e.g. {group}=1e-4,3e-4") from None
        if any(not lr > 0 for lr in rates) or len({rate_key(lr) for lr in rates}) != len(rates):
            raise UsageError(f"--scheme-lrs {item!r}: rates must be > 0 and distinct")
        grids[group] = rates
    return grids


def _scheme_lrs(given: Sequence[str] | None, groups: Sequence[str]) -> list[str]:
    """``--scheme-lrs`` as given (each must name a group), or the default grids of the groups among ``--schemes``."""
    if given is not None:
        return list(given)
    return [item for item in DEFAULTS.scheme_lrs if item.rpartition("=")[0] in groups]


@dataclass(frozen=True)
class BudgetSetup:
    """One invocation of the map, decided before any run trains: its design (a fresh one, nothing selected), the
    settings every run shares (``base``: each budget then sets its steps), the data and how runs execute."""

    argv: tuple[str, ...]
    options: StudyOptions
    design: BudgetDesign
    base: RunSpec
    data: StudyData
    settings: TrainerSettings
    val_batches: int
    tokens_per_step: int

    @property
    def out(self) -> Path:
        return self.options.out if self.options.out is not None else Path("runs") / "token-budget"

    @property
    def config(self) -> LlamaConfig:
        return LlamaConfig.from_name(self.base.preset, **self.base.overrides)

    def first_spec(self) -> RunSpec:
        """The run the dry run's probe times: the first group's first selection run on the largest budget."""
        design = self.design
        group = design.groups[0]
        return selection_specs(group, design.grids[group.label], budget_base(self.base, design.budgets[-1]))[0]

    def reusable_runs(self) -> list[str]:
        """The labels of the runs the map would read back from ``out`` instead of training: its protocol replayed on
        the finished runs as far as they carry it (a budget's evaluation runs count once its group's selection is
        complete there or on its donor). Reads, never writes."""
        design = self.design  # read, never filled: the selections replayed here are not the study's
        reused: list[str] = []

        def found(specs: Sequence[RunSpec]) -> list[RunResult]:
            results = [r for r in (estimate.read_back(self.out, s) for s in specs) if r is not None]
            reused.extend(r.spec.label for r in results)
            return results

        heirs = [b for b in design.budgets if b not in design.selected_budgets]
        for budget in design.selected_budgets:
            base = budget_base(self.base, budget)
            for g in design.groups:
                grid = design.grids[g.label]
                specs = selection_specs(g, grid, base)
                runs = found(specs)
                while len(runs) == len(specs):
                    step = select(g, runs, grid, design.extensions, base)
                    if isinstance(step, RunSpec):
                        specs = [*specs, step]
                        runs += found([step])
                        continue
                    takers = [budget] + (heirs if budget == design.selected_budgets[-1] else [])
                    for taker in takers:
                        found(evaluation_specs(g, step, (), design.n_seeds, budget_base(self.base, taker)))
                    break
        return list(dict.fromkeys(reused))

    def meta(self) -> dict[str, object]:
        """The report's head: the command, the design's settings, the size of each budget's runs, the data, the
        machine and its load now."""
        from bhyt_pl.machine import machine_info

        design, corpus = self.design, self.data.training_tokens_per_epoch()
        specs = [spec for g in design.groups for spec in selection_specs(g, design.grids[g.label][:1], self.base)]
        sizes = {b.label: run_sizes(specs, b.tokens(self.tokens_per_step), corpus)[0].to_dict() for b in design.budgets}
        return {
            "command": "python -m bhyt_pl study token-budget " + shlex.join(self.argv),
            "mode": "token-budget",
            "preset": self.base.preset,
            "overrides": dict(self.base.overrides),
            "seq_len": self.data.seq_len,
            "batch_size": self.data.batch_size,
            "tokens_per_step": self.tokens_per_step,
            "size": sizes,
            "schemes": [g.label for g in design.groups],
            "selection_seed": "index 0 (seed 42); evaluation seeds: indices 1..N (seeds 43..42+N)",
            "workers": self.options.workers,
            "launcher": self.options.launcher,
            "compile": self.settings.compile,
            "data": f"{self.options.data_files} (tokenizer {self.options.tokenizer})",
            "validation": f"{self.val_batches} fixed batches of {self.data.batch_size} x {self.data.seq_len} = "
            f"{self.val_batches * self.tokens_per_step:,} tokens: validation loss, depth statistics and saturation",
            "unigram_loss": None,
            "max_loss": round(self.base.max_loss, 4),
            "loadavg_at_start": loadavg_text(),
            "machine": machine_info(torch.device("cuda" if self.settings.accelerator in ("gpu", "cuda") else "cpu")),
        }


def setup_from(args: argparse.Namespace, argv: Sequence[str]) -> BudgetSetup:
    """The map the parsed options describe; one ``UsageError`` naming every bad option, before any work."""
    problems = []
    for name in ("seeds", "val_batches", "seq_len", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.val_batches is not None and args.val_batches < 4:
        problems.append(f"--val-batches must be >= 4 (depth statistics need 4 batches), got {args.val_batches}")
    if args.extensions < 0:
        problems.append(f"--extensions must be >= 0, got {args.extensions}")
    if any(not lr > 0 for lr in args.lrs) or len({rate_key(lr) for lr in args.lrs}) != len(args.lrs):
        problems.append(f"--lrs must be > 0 and distinct, got {args.lrs}")
    if args.max_loss is not None and not args.max_loss > 0:
        problems.append(f"--max-loss must be > 0, got {args.max_loss}")
    if args.workers is not None and args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    raise_if_problems("token-budget arguments", problems)
    seq_len = args.seq_len or DEFAULTS.seq_len
    batch_size = args.batch_size or DEFAULTS.batch_size
    val_batches = args.val_batches or DEFAULTS.val_batches
    overrides = parse_overrides(args.override)
    config = LlamaConfig.from_name(args.preset, **overrides)  # unknown fields and bad values fail here
    if seq_len > config.max_seq_len:
        raise UsageError(f"--seq-len {seq_len} exceeds {args.preset}'s max_seq_len={config.max_seq_len}")
    groups = []
    for text in args.schemes:
        try:
            groups.append(parse_group(text))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--schemes {text!r}: {exc}") from None
    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--schemes has duplicates: {labels}")
    check_disjoint(groups)
    tokens_per_step = seq_len * batch_size
    try:
        budgets = token_budgets(args.budgets, block_params(config), tokens_per_step)
        design = BudgetDesign(
            tuple(groups),
            args.reference,
            budgets,
            _grids(groups, args.lrs, _scheme_lrs(args.scheme_lrs, labels)),
            args.seeds,
            args.extensions,
            args.select_through or 0,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    base = RunSpec(
        label="base",
        norm="rmsnorm",
        preset=args.preset,
        overrides=overrides,
        lr=args.lrs[0],
        steps=budgets[0].steps,
        seed=42,
        data_seed=42,
        max_loss=args.max_loss if args.max_loss is not None else 1.5 * math.log(config.vocab_size),
        warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        importance=False,
    )
    options = StudyOptions(
        out=args.out,
        restart=args.restart,
        workers=args.workers,
        launcher=args.launcher,
        threads=args.threads,
        data_files=args.data_files,
        tokenizer=args.tokenizer,
        mfu=args.mfu,
        peak_tflops=args.peak_tflops,
        probe_steps=args.probe_steps,
    )
    data = study_data(args, seq_len, batch_size)
    return BudgetSetup(tuple(argv), options, design, base, data, trainer_settings(args), val_batches, tokens_per_step)


def _span(low: float, high: float, spec: str) -> str:
    """``low-high`` in format ``spec``, one number when they agree."""
    a, b = format(low, spec), format(high, spec)
    return a if a == b else f"{a}-{b}"


def dry_run_text(setup: BudgetSetup, probe: estimate.Probe | None = None, workers: int = 1) -> str:
    """What ``--dry-run`` prints: per budget its T/P, steps, tokens, runs (a range: extensions), training FLOPs and
    GPU-hours; the runs ``--out`` already holds; the CPU time from ``probe``; the assumptions."""
    design, args = setup.design, setup.options
    flops_per_token = training_flops_per_token(setup.config, setup.data.seq_len)
    lines = [f"token-budget dry run (--out {setup.out}): nothing is trained or written", ""]
    groups, seeds = len(design.groups), design.n_seeds
    header = "| T/P | steps | tokens | early step | runs | training FLOPs | GPU-hours | steps of all its runs |"
    lines += [header, "|" + "---|" * 8]
    total_runs, total_flops, total_steps = [0, 0], [0.0, 0.0], [0, 0]
    for b in design.budgets:
        grid = sum(len(design.grids[g.label]) for g in design.groups) if b in design.selected_budgets else 0
        extension = groups * design.extensions if grid else 0
        low, high = grid + groups * seeds, grid + extension + groups * seeds
        tokens = b.tokens(setup.tokens_per_step)
        flops = (low * tokens * flops_per_token, high * tokens * flops_per_token)
        hours = [estimate.gpu_hours(f, args.mfu, args.peak_tflops) for f in flops]
        lines.append(
            f"| {b.label} | {b.steps:,} | {tokens:,} | {b.early_step} | {_span(low, high, 'd')} "
            f"| {_span(*flops, '.3g')} | {_span(*hours, '.3g')} | {_span(low * b.steps, high * b.steps, ',')} |"
        )
        for i, v in enumerate((low, high)):
            total_runs[i] += v
            total_flops[i] += v * tokens * flops_per_token
            total_steps[i] += v * b.steps
    hours = [estimate.gpu_hours(f, args.mfu, args.peak_tflops) for f in total_flops]
    lines += [
        "",
        f"runs: {total_runs[0]} to {total_runs[1]} ({groups} groups x {len(design.budgets)} budgets; selection on "
        f"the {design.select_through} smallest, up to {design.extensions} extension(s) a group and budget; "
        f"{seeds} evaluation seeds)",
        f"training FLOPs in total: {total_flops[0]:.3g} to {total_flops[1]:.3g}; GPU-hours at {args.mfu:.0%} MFU "
        f"of {args.peak_tflops:g} TFLOP/s: {hours[0]:.3g} to {hours[1]:.3g}",
        f"finished in {setup.out} with the same settings, reused: {len(setup.reusable_runs())}"
        + (" (--restart retrains every run)" if args.restart else ""),
        f"parameters (bhyt_pl/model_size.py): {run_sizes([setup.base], 0, None)[0].counts_text()}",
    ]
    if setup.settings.accelerator == "cpu":
        if probe is None:
            lines.append("CPU time: unknown (no probe; --probe-steps N times N training steps)")
        else:
            low, high = (probe.seconds_per_step * s / workers for s in total_steps)
            lines.append(
                f"CPU time at the probe's pace with {workers} worker(s): {low / 60:.0f} to {high / 60:.0f} min of "
                f"training steps ({probe.seconds_per_step:.3f} s a step, load {probe.loadavg[0]:.2f}; each run's "
                "setup, compile, validation and trajectory points come on top)"
            )
    return "\n".join(lines)


def dry_run(setup: BudgetSetup, workers: int = 1) -> int:
    """``--dry-run``: check the options, probe the CPU pace (``--probe-steps``; CPU only), print; 0 on success."""
    args = setup.options
    estimate.check_arguments(args)
    probe = None
    if setup.settings.accelerator == "cpu" and args.probe_steps > 0:
        threads = 1 if workers > 1 else args.threads
        probe = estimate.probe_pace(setup.first_spec(), setup.data, args.probe_steps, setup.settings.compile, threads)
    print(dry_run_text(setup, probe, workers))
    return 0


class TokenBudgetKind(StudyKind):
    """The token-budget map on the shared driver: its plan is ``run_token_budget``, its document
    ``bhyt_pl.study.report.token_budget``."""

    name = "token_budget"
    command = "token-budget"
    description = (
        "Map norm schemes across tokens per parameter: at each --budgets T/P a full run per scheme with its own "
        "schedule, its rate selected per budget on a selection seed, --seeds evaluation seeds at that rate; report "
        "the loss difference to --reference with paired intervals and minimum detectable differences, the "
        "train-validation gap, depth claims at init / end / made by training, tanh saturation, the crossover in "
        "ln T/P and the early-saturation rule."
    )
    dry_run_help = (
        "print each budget's T/P, steps, runs, training FLOPs and GPU-hours, the runs --out already holds and, on "
        "the CPU, the time from a short probe; trains nothing, writes nothing"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_arguments(parser)

    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        setup = setup_from(argparse.Namespace(**values), argv)
        meta = {} if values.get("dry_run") else setup.meta()
        recorded = RecordedSetup(setup.data, setup.val_batches, setup.settings, {})
        record = StudyRecord(self.name, meta, [], recorded, budgets=setup.design)

        def execute(scheduler: Scheduler, on_result: OnResult) -> list[RunResult]:
            return run_token_budget(setup.design, setup.base, scheduler, on_result)

        return PreparedStudy(
            out=setup.out,
            record=record,
            base_data_seed=setup.base.data_seed,
            execute=execute,
            final=lambda: (
                len(setup.design.selections) == len(setup.design.selected_budgets)
                and all(len(by) == len(setup.design.groups) for by in setup.design.selections.values())
            ),
            dry_run=lambda workers: dry_run(setup, workers),
            on_start=unigram_loss_recorder(meta, setup.data, setup.base.data_seed, setup.config.vocab_size),
            noun="token-budget map",
        )

    def sections(self, record: StudyRecord) -> dict[str, object]:
        return report.sections(record)

    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        return report.write_report(out, record, figures=figures)


TOKEN_BUDGET = register_kind(TokenBudgetKind())

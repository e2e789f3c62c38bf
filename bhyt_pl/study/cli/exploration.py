"""``python -m bhyt_pl study``: the depth study and the stability sweep (docs/depth_study.md).

Depth study (default, protocol v3 of ``bhyt_pl.study.protocol.plan``): every ``--schemes`` group picks its
candidate and learning rate on a selection seed (``--lrs``, extended past an edge up to ``--extensions``
times), then trains ``--seeds`` evaluation seeds at that best rate and at each ``--matched-lrs`` rate.
Writes ``report.md`` (claims from the ``bhyt_pl.study.protocol.claims`` table with per-claim and Holm-adjusted
verdicts, claims over training, depth-wise growth, per-group tables, LR sensitivity, layer importance,
StabilityMonitor columns), figures, ``results.json`` (every run, the design, every claim with its run labels)
and one ``runs/<label>/`` folder per run. Runs are reused: a run whose ``result.json`` matches its spec
(across invocations sharing ``--out``) is read back instead of retrained.

Stability sweep (``--sweep``): schemes x ``--depths`` x ``--lrs`` x seeds; ``report.md`` with the grid.

``--report-from DIR`` rebuilds ``DIR/report.md`` and its figures from ``DIR/results.json`` alone.

This module is the exploration as a kind of study (``ExplorationKind``): its options, its setup (``prepare``, a
``StudySetup``), its plan and its document; the shared driver (``bhyt_pl.study.cli.driver``) runs it. The protocol
drivers are in ``bhyt_pl.study.launch.execution``, the report in ``bhyt_pl.study.report.exploration``.

Examples::

    python -m bhyt_pl study --quick --workers 2           # at most 10 minutes on 2 CPU cores
    python -m bhyt_pl study --workers 2                   # the committed report (docs/depth_study.md)
    python -m bhyt_pl study --sweep --quick               # small stability grid
    python -m bhyt_pl study --schemes rmsnorm "bhyt:lambda_attn=1.0|2.0" --seeds 5 --lrs 1e-3 3e-3
    python -m bhyt_pl study --report-from docs/depth_study  # the committed report again, no training
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bhyt_pl.config import PRESETS, LlamaConfig
from bhyt_pl.errors import UsageError
from bhyt_pl.study.cli import estimate
from bhyt_pl.study.cli.arguments import StudyArgumentParser
from bhyt_pl.study.cli.config_file import expand_config_files
from bhyt_pl.study.cli.kinds import OnResult, PreparedStudy, StudyKind, register_kind, study_parser
from bhyt_pl.study.cli.run_arguments import (
    COMPILE_DEFAULT,
    add_data_arguments,
    add_hardware_arguments,
    add_schedule_arguments,
    parse_overrides,
    study_data,
    trainer_settings,
)
from bhyt_pl.study.cli.setup import Budget, StudyOptions, StudySetup
from bhyt_pl.study.launch.execution import run_all, run_depth_study
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.claims import evaluate
from bhyt_pl.study.protocol.design import SchemeGroup, StudyRuns, check_disjoint, parse_group, rate_key
from bhyt_pl.study.protocol.plan import sweep_specs
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.report import exploration as report
from bhyt_pl.study.run.data import unigram_loss_recorder
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
    "StudySetup",
    "EXPLORATION",
    "ExplorationKind",
    "add_arguments",
    "parser",
    "prepare",
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
"""The roles of the claims table (``bhyt_pl.study.protocol.claims``) and the default group each plays; ``--roles
ROLE=GROUP`` remaps one (e.g. ``--roles DyT=dyt:alpha_attn=1.0``). A claim whose roles have no group is listed
as not tested."""

REMOVED_FLAGS = {
    "--seed": "--seeds N (evaluation seeds 43..42+N after the selection seed 42; each seeds the initialisation "
    "and the data order)",
    "--data-seed": "--seeds N (seed i shuffles the data with 42 + i)",
    "--lr": "--lrs LR [LR ...] (the learning-rate grid; one value: that learning rate for every scheme)",
}
"""Flags the study does not take and what replaces them. Each is declared so that using it is an error naming its
replacement (the parser takes no abbreviation, so ``--seed 43`` is never read as ``--seeds 43``)."""


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


class _Removed(argparse.Action):
    """A removed flag: parsing fails with the name of its replacement."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser.error(f"{option_string} was removed; use {REMOVED_FLAGS[option_string]}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The exploration's options (the driver adds the launcher's, ``--out``, ``--restart``, ``--config``, ``--threads``
    and ``--report-from``)."""
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
    add_schedule_arguments(model)
    model.add_argument(
        "--trajectory-every",
        type=int,
        default=None,
        help=f"depth statistics every N steps (0: init and end only); default {FULL.trajectory_every}",
    )
    model.add_argument("--no-importance", action="store_true", help="skip the layer-importance measurement")
    add_data_arguments(p, FULL.seq_len, FULL.batch_size, FULL.val_batches)
    add_hardware_arguments(p, compile_default=COMPILE_DEFAULT)
    estimate.add_arguments(p)
    for flag in REMOVED_FLAGS:
        p.add_argument(flag, action=_Removed, help=argparse.SUPPRESS)


def resolve(args: argparse.Namespace) -> tuple[Budget, dict[str, object]]:
    """The budget (mode defaults, then explicit options) and the model overrides; fails early on bad values."""
    base = (SWEEP_QUICK if args.quick else SWEEP) if args.sweep else (QUICK if args.quick else FULL)

    def pick(name: str, value: object) -> Any:  # noqa: ANN401 (a Budget field: int or tuple)
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
    # rates are compared as run labels write them (6 significant digits): 1e-3 and 0.0010000001 are one rate
    if args.matched_lrs is not None and len({rate_key(lr) for lr in args.matched_lrs}) != len(args.matched_lrs):
        problems.append(f"--matched-lrs has duplicates (each would be tested twice): {args.matched_lrs}")
    for item in args.roles:
        if "=" not in item:
            problems.append(f"--roles {item!r} must be ROLE=GROUP, e.g. --roles DyT=dyt:alpha_attn=1.0")
    if budget.trajectory_every < 0:
        problems.append(f"--trajectory-every must be >= 0, got {budget.trajectory_every}")
    if args.workers is not None and args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if budget.layers is not None and budget.layers < 1:
        problems.append(f"--layers must be >= 1, got {budget.layers}")
    if args.sweep and args.layers is not None:
        problems.append("--layers does not apply to --sweep; give the depths with --depths")
    if args.sweep and any(d < 1 for d in budget.depths):
        problems.append(f"--depths must be >= 1, got {budget.depths}")
    if any(not lr > 0 for lr in budget.lrs):
        problems.append(f"--lrs must be > 0, got {budget.lrs}")
    if len({rate_key(lr) for lr in budget.lrs}) != len(budget.lrs):
        problems.append(f"--lrs has duplicates (rates equal to 6 significant digits share a run label): {budget.lrs}")
    if args.max_loss is not None and not args.max_loss > 0:
        problems.append(f"--max-loss must be > 0, got {args.max_loss}")
    overrides: dict[str, object] = {}
    try:
        overrides = parse_overrides(args.override)
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


def prepare(argv: Sequence[str] = ()) -> StudySetup:
    """The study ``python -m bhyt_pl study ARGV`` would run, without running it. Bad values raise one
    ``ValueError`` naming the option; an unparsable command line exits as argparse does."""
    p = study_parser(EXPLORATION)
    return _setup(p.parse_args(expand_config_files(p, argv)), argv)


def _scheme_group(text: str) -> SchemeGroup:
    """``parse_group``, its errors (an unknown scheme, an argument the scheme does not take, a bad value) as one
    ``UsageError`` naming the ``--schemes`` entry."""
    try:
        return parse_group(text)
    except (TypeError, ValueError) as exc:  # the scheme's constructor check raises TypeError, as Python's own does
        raise UsageError(f"--schemes {text!r}: {exc}") from None


def _setup(args: argparse.Namespace, argv: Sequence[str]) -> StudySetup:
    budget, overrides = resolve(args)
    groups = tuple(_scheme_group(text) for text in args.schemes)
    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--schemes has duplicates: {labels}")
    check_disjoint(groups)
    roles = dict(DEFAULT_ROLES)
    for item in args.roles:
        role, _, group = item.partition("=")
        if role not in DEFAULT_ROLES or group not in labels:
            raise ValueError(f"--roles {item!r}: ROLE must be one of {sorted(DEFAULT_ROLES)} and GROUP one of {labels}")
        roles[role] = group
    return StudySetup(
        argv=tuple(argv),
        options=StudyOptions(
            sweep=args.sweep,
            quick=args.quick,
            out=args.out,
            restart=args.restart,
            matched_lrs=tuple(args.matched_lrs) if args.matched_lrs is not None else None,
            workers=args.workers,
            launcher=args.launcher,
            threads=args.threads,
            data_files=args.data_files,
            tokenizer=args.tokenizer,
            mfu=args.mfu,
            peak_tflops=args.peak_tflops,
            probe_steps=args.probe_steps,
        ),
        budget=budget,
        overrides=overrides,
        groups=groups,
        roles=roles,
        base=_base_spec(args, budget, overrides),
        data=study_data(args, budget.seq_len, budget.batch_size),
        settings=trainer_settings(args),
    )


def _base_spec(args: argparse.Namespace, budget: Budget, overrides: dict[str, object]) -> RunSpec:
    """The settings every run of one study invocation shares (each run then sets its scheme, rate and seed)."""
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


class ExplorationKind(StudyKind):
    """The exploration: every scheme group over seeds at its own selected rate and at the matched rates (protocol
    v3, ``bhyt_pl.study.launch.execution``), or the stability sweep (``--sweep``); its document is
    ``bhyt_pl.study.report.exploration``."""

    name = "exploration"
    command = ""
    description = (
        "Train every norm scheme over seeds with its own learning rate (chosen from --lrs by validation loss on the "
        "selection seed, which no evaluation seed reuses) and report claims with seed-paired 95% intervals, depth "
        "trajectories, stability columns, LR sensitivity and layer importance (--sweep: stability grid over depth x "
        "LR)."
    )
    dry_run_help = (
        "print the runs the study would train (a range: the protocol adds grid extensions and the matched arm "
        "as it goes), how many are finished in --out and would be reused, training FLOPs, GPU-hours and, on the CPU, "
        "the time from a short probe; trains nothing, writes nothing"
    )
    epilog = (
        "python -m bhyt_pl study confirm --pilot DIR: the confirmation stage on a finished study's results "
        "(python -m bhyt_pl study confirm --help; docs/method.md, section 10)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        setup = _setup(argparse.Namespace(**values), argv)
        # a dry run records nothing, and may plan for accelerators this machine lacks (the meta names the machine)
        meta = {} if values.get("dry_run") else setup.meta()
        design = setup.design()
        base, budget = setup.base, setup.budget
        roles = {role: group for role, group in setup.roles.items() if group in {g.label for g in setup.groups}}
        recorded = RecordedSetup(setup.data, budget.val_batches, setup.settings, roles)
        record = StudyRecord(self.name, meta, [], recorded, design)

        def execute(scheduler: Scheduler, on_result: OnResult) -> list[RunResult]:
            if design is None:
                specs = sweep_specs(setup.groups, budget.depths, budget.lrs, budget.seeds, base)
                return run_all(specs, scheduler, on_result)
            return run_depth_study(design, base, scheduler, on_result, matched_lrs=setup.options.matched_lrs)

        return PreparedStudy(
            out=setup.out,
            record=record,
            base_data_seed=base.data_seed,
            execute=execute,
            final=lambda: design is None or design.complete,
            dry_run=partial(estimate.dry_run, setup),
            on_start=unigram_loss_recorder(meta, setup.data, base.data_seed, setup.config.vocab_size),
        )

    def sections(self, record: StudyRecord) -> dict[str, object]:
        """Every claim's tests and run labels, as evaluated now (``bhyt_pl.study.protocol.claims``)."""
        if record.design is None:
            return {}
        tokens_per_step = int(record.meta.get("tokens_per_step", 0))
        items, skipped = evaluate(
            StudyRuns(record.runs), record.design, record.meta.get("roles", {}), tokens_per_step=tokens_per_step
        )
        return {
            "claims": [c.to_dict() for c in items],
            "claims_not_tested": [f"{c.statement}: {c.target} vs {c.baseline}" for c in skipped],
        }

    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        return report.write_report(out, record, figures=figures)


EXPLORATION = register_kind(ExplorationKind())


def parser() -> StudyArgumentParser:
    """The exploration's whole command line: its options and the driver's."""
    return study_parser(EXPLORATION)

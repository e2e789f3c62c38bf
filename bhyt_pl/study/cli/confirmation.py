"""``python -m bhyt_pl study confirm``: the confirmation stage as a kind of study
(``bhyt_pl.study.cli.confirmation_plan``; docs/method.md, section 10, "Confirmation").

It reads the pilot (``--pilot DIR``: a finished exploration's folder), freezes the plan in ``OUT/plan.json`` and
prints it before any run (``--plan-only`` and ``--dry-run`` stop there and write nothing), then the shared driver
(``bhyt_pl.study.cli.driver``) trains the plan's runs with the setup the pilot's record holds (its data, validation
batches and trainer settings, never its command line parsed again) and writes ``OUT/results.json``,
``OUT/report.md`` and figures after every run. ``--report-from DIR`` rebuilds the report from ``results.json`` alone.

Examples::

    python -m bhyt_pl study confirm --pilot docs/depth_study --max-seeds 13 --plan-only  # the plan; writes nothing
    python -m bhyt_pl study confirm --pilot docs/depth_study --max-seeds 13 --workers 2  # into .../confirmation
    python -m bhyt_pl study confirm --report-from docs/depth_study/confirmation
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from bhyt_pl.study.cli.confirmation_plan import (
    PLAN_FILE,
    Pilot,
    confirmation_specs,
    frozen_plan,
    load_pilot,
    make_confirmation_plan,
)
from bhyt_pl.study.cli.kinds import OnResult, PreparedStudy, StudyKind, register_kind
from bhyt_pl.study.cli.setup import loadavg_text
from bhyt_pl.study.launch.execution import run_all
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol import power, power_plan, power_plan_text
from bhyt_pl.study.protocol.confirmation import evaluate
from bhyt_pl.study.protocol.metrics import END
from bhyt_pl.study.protocol.size import run_sizes
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, TrainerSettings
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.report.confirmation import write_report
from bhyt_pl.validation import raise_if_problems

__all__ = ["CONFIRMATION", "ConfirmationKind", "add_arguments"]


# ----------------------------------------------------------------------------- the command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The confirmation's options (the driver adds the launcher's, ``--out``, ``--restart``, ``--config``,
    ``--threads``, ``--dry-run`` and ``--report-from``)."""
    p.add_argument("--pilot", type=Path, default=None, metavar="DIR", help="the exploration's folder (results.json)")
    p.add_argument(
        "--max-seeds",
        type=int,
        default=None,
        help=f"a test needing more seeds leaves the family before any run; default {power_plan.MAX_SEEDS} (a frozen "
        "plan keeps its own)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="every planned group trains N seeds instead of the plan's "
        "counts (the family is still the one --max-seeds leaves)",
    )
    p.add_argument("--rate", type=float, default=None, help="which of the pilot's matched rates; default the highest")
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="print the plan (the frozen one if OUT has it) and stop; writes nothing",
    )
    hw = p.add_argument_group(
        "hardware (default: the pilot's command, but --workers: the CPUs this process may use, or its visible GPUs)"
    )
    hw.add_argument(
        "--workers", type=int, default=None, help="runs in parallel, one process with one torch thread each"
    )
    hw.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile each block")
    hw.add_argument("--accelerator", default=None, help="cpu, gpu, auto, ...")
    hw.add_argument("--devices", default=None, help="devices per run")
    hw.add_argument("--precision", default=None, help="32-true, bf16-mixed, ...")
    hw.add_argument("--progress-bar", action="store_true", help="show Lightning's progress bar")


def _check(args: argparse.Namespace) -> None:
    problems = []
    if args.pilot is None:
        problems.append("--pilot DIR is required: the folder of a finished exploration (python -m bhyt_pl study)")
    if args.max_seeds is not None and args.max_seeds < power.MIN_SEEDS:
        problems.append(f"--max-seeds must be >= {power.MIN_SEEDS} (the pilot's own count), got {args.max_seeds}")
    if args.seeds is not None and args.seeds < 2:
        problems.append(f"--seeds must be >= 2 (a t-test needs 2 pairs), got {args.seeds}")
    if args.workers is not None and args.workers < 1:
        problems.append(f"--workers must be >= 1, got {args.workers}")
    if args.rate is not None and not args.rate > 0:
        problems.append(f"--rate must be > 0, got {args.rate}")
    if args.pilot is not None and args.out is not None and args.out.resolve() == args.pilot.resolve():
        problems.append(
            f"--out {str(args.out)!r} is the pilot's folder; the confirmation writes into its own "
            "(default PILOT/confirmation)"
        )
    raise_if_problems("study confirm arguments", problems)


def _settings(pilot_settings: TrainerSettings, args: argparse.Namespace) -> TrainerSettings:
    devices = args.devices if args.devices is not None else pilot_settings.devices
    return replace(
        pilot_settings,
        accelerator=args.accelerator or pilot_settings.accelerator,
        devices=int(devices) if str(devices).isdigit() else devices,
        precision=args.precision or pilot_settings.precision,
        compile=pilot_settings.compile if args.compile is None else args.compile,
        progress_bar=args.progress_bar,
    )


def _meta(argv: Sequence[str], pilot: Pilot, plan: power_plan.Plan, specs: Sequence[RunSpec], settings: TrainerSettings,
          launcher: str) -> dict[str, object]:  # fmt: skip
    from bhyt_pl.machine import machine_info

    meta = pilot.record.meta
    setup = pilot.record.setup
    corpus = setup.data.training_tokens_per_epoch() if setup is not None else None
    sizes = run_sizes(specs, int(meta.get("tokens_per_run") or 0), corpus) if specs else []
    return {
        "command": "python -m bhyt_pl study confirm " + shlex.join(argv),
        "pilot": str(pilot.folder),
        "pilot_results_sha256": pilot.sha256,
        "pilot_command": meta.get("command"),
        "rate": float(plan.source["rate"]),
        "preset": meta.get("preset"),
        "n_layers_label": meta.get("n_layers_label"),
        "steps": meta.get("steps"),
        "tokens_per_step": meta.get("tokens_per_step"),
        "tokens_per_run": meta.get("tokens_per_run"),
        "size": [size.to_dict() for size in sizes],
        "runs_planned": len(specs),
        "seed_indices": sorted({spec.seed_index for spec in specs}),
        "launcher": launcher,
        "compile": settings.compile,
        "loadavg_at_start": loadavg_text(),
        "machine": machine_info(torch.device("cuda" if settings.accelerator in ("gpu", "cuda") else "cpu")),
    }


class ConfirmationKind(StudyKind):
    """The confirmation: a power plan frozen from a finished exploration, its runs on new seeds, and its verdicts
    (``bhyt_pl.study.protocol.confirmation``); its document is ``bhyt_pl.study.report.confirmation``."""

    name = "confirmation"
    command = "confirm"
    dry_run_help = "print the plan (the frozen one if OUT has it) and its run count; train nothing, write nothing"
    description = (
        "The confirmation stage (docs/method.md, section 10, 'Confirmation'): read a finished exploration's "
        "results.json (--pilot), freeze a power plan in OUT/plan.json and print it, train only the groups its primary "
        "family needs at the pilot's matched rate on new seeds above every pilot seed, and report one-sided tests "
        "with Holm's adjustment and the paper-level claims as intersection-union tests."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)

    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        args = argparse.Namespace(**values)
        _check(args)
        pilot = load_pilot(args.pilot)
        out = args.out if args.out is not None else args.pilot / "confirmation"
        plan_path = out / PLAN_FILE
        if (args.plan_only or args.dry_run) and not plan_path.exists():
            rate = pilot.rate(args.rate)
            max_seeds = power_plan.MAX_SEEDS if args.max_seeds is None else args.max_seeds
            plan = make_confirmation_plan(pilot, rate, max_seeds, args.seeds)
        else:
            plan = frozen_plan(plan_path, pilot, args.rate, args.max_seeds, args.seeds)
        frozen = "frozen in " + str(plan_path) if plan_path.exists() else "not written: --plan-only"
        print(power_plan_text.render(plan) + f"\n\n(plan {frozen})", flush=True)
        pilot_setup = pilot.record.setup
        assert pilot_setup is not None  # load_pilot refuses a record without one
        settings = _settings(pilot_setup.settings, args)
        specs = confirmation_specs(plan, pilot)
        setup = replace(pilot_setup, settings=settings, source="the pilot's, with this command's hardware options")
        meta = {} if args.dry_run else _meta(argv, pilot, plan, specs, settings, args.launcher)  # names the machine
        record = StudyRecord(self.name, meta, [], setup, plan=plan)
        first = specs[0] if specs else pilot.record.runs[0].spec

        def execute(scheduler: Scheduler, on_result: OnResult) -> list[RunResult]:
            return run_all(specs, scheduler, on_result)

        def dry_run(workers: int) -> int:
            print(f"\nruns: {len(specs)} on {workers} worker(s); nothing trained, nothing written", flush=True)
            return 0

        return PreparedStudy(
            out=out,
            record=record,
            base_data_seed=first.data_seed - first.seed_index,
            execute=execute,
            dry_run=dry_run,
            stop=0 if args.plan_only else None,
            noun="confirmation",
        )

    def sections(self, record: StudyRecord) -> dict[str, object]:
        """The ``family`` (per primary test its runs, plan row, one-sided p, Holm p and verdict), the
        ``paper_claims``, the ``exploratory`` rows with their reasons and seed counts and the rows ``not_tested``."""
        assert record.plan is not None
        evaluation = evaluate(record.plan, record.runs, int(record.meta.get("tokens_per_step") or 0))
        plan = record.plan
        return {
            "family": [t.to_dict() for t in evaluation.tests],
            "paper_claims": [c.to_dict() for c in evaluation.claims],
            "exploratory": [
                {
                    "name": t.name,
                    "statistic": t.statistic,
                    **({"phase": t.phase} if t.phase != END else {}),  # only when not the end, as in plan.json
                    "rule": t.rule,
                    "margin": t.margin,
                    "rate": t.rate,
                    "status": t.status,
                    "reason": t.reason,
                    "pilot": {"n": t.pilot_n, "mean": t.pilot_mean, "low_80": t.pilot_low, "high_80": t.pilot_high},
                    "level": t.level,
                    "seeds_at_80_percent_power": t.seeds,
                    "plug_in_seeds": t.plug_in_seeds,
                }
                for t in plan.tests
                if not t.primary
            ],
            "not_tested": list(plan.source.get("not_tested", [])),
        }

    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        return write_report(out, record, figures=figures)


CONFIRMATION = register_kind(ConfirmationKind())

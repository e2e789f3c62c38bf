"""``python -m bhyt_pl study confirm``: the command line of the confirmation stage
(``bhyt_pl.study.cli.confirmation_plan``;
docs/method.md, section 10, "Confirmation").

It reads the pilot (``--pilot DIR``: a finished exploration's folder), freezes the plan in ``OUT/plan.json`` and
prints it before any run (``--plan-only`` stops there and writes nothing), then trains the plan's runs through the
study's ``Scheduler`` with the pilot's data and settings (its command line parsed again by
``bhyt_pl.study.cli.exploration.prepare``) and writes ``OUT/results.json``, ``OUT/report.md`` and figures after every
run.
``--report-from DIR`` rebuilds a confirmation's report from its ``results.json`` alone.

Examples::

    python -m bhyt_pl study confirm --pilot docs/depth_study --max-seeds 13 --plan-only  # the plan; writes nothing
    python -m bhyt_pl study confirm --pilot docs/depth_study --max-seeds 13 --workers 2  # into .../confirmation
    python -m bhyt_pl study confirm --report-from docs/depth_study/confirmation
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from bhyt_pl.study.cli.arguments import StudyArgumentParser
from bhyt_pl.study.cli.confirmation_plan import (
    COMMAND_PREFIX,
    PLAN_FILE,
    Pilot,
    confirmation_specs,
    frozen_plan,
    load_pilot,
    make_confirmation_plan,
)
from bhyt_pl.study.cli.exploration import prepare
from bhyt_pl.study.cli.setup import StudySetup, loadavg_text
from bhyt_pl.study.launch.execution import run_all
from bhyt_pl.study.launch.options import add_launcher_arguments, check_launcher, interrupted_runs, make_launcher
from bhyt_pl.study.launch.scheduler import Scheduler, progress_line
from bhyt_pl.study.protocol import power
from bhyt_pl.study.protocol.spec import RunResult, RunStatus, TrainerSettings
from bhyt_pl.study.record.confirmation import KIND, ConfirmationRecord, load
from bhyt_pl.study.record.results import Invocation
from bhyt_pl.study.report.confirmation import write_report
from bhyt_pl.study.run import runner
from bhyt_pl.validation import raise_if_problems

__all__ = ["main", "parser", "pilot_setup", "report_from"]

log = logging.getLogger(__name__)


def report_from(folder: Path, figures: bool = True) -> dict[str, Path]:
    """``report.md`` and (``figures``) the figures of a confirmation, rebuilt from ``folder/results.json`` alone
    (read, not written)."""
    try:
        record = load(folder)
    except ValueError as exc:
        raise ValueError(f"--report-from {str(folder)!r}: {exc}") from exc
    return write_report(Path(folder), record, figures=figures, save=False)


# ----------------------------------------------------------------------------- the command line
def parser() -> StudyArgumentParser:
    """The confirmation's options; errors are one line, abbreviations are unrecognized (``StudyArgumentParser``)."""
    p = StudyArgumentParser(
        prog="python -m bhyt_pl study confirm",
        description="The confirmation stage (docs/method.md, section 10, 'Confirmation'): read a finished "
        "exploration's results.json (--pilot), freeze a power plan in OUT/plan.json and print it, train only the "
        "groups its primary family needs at the pilot's matched rate on new seeds above every pilot seed, and "
        "report one-sided tests with Holm's adjustment and the paper-level claims as intersection-union tests.",
    )
    p.add_argument("--pilot", type=Path, default=None, metavar="DIR", help="the exploration's folder (results.json)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="the confirmation's folder; default PILOT/confirmation (never the pilot's own folder)",
    )
    p.add_argument(
        "--max-seeds",
        type=int,
        default=None,
        help=f"a test needing more seeds leaves the family before any run; default {power.MAX_SEEDS} (a frozen "
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
    p.add_argument("--restart", action="store_true", help="retrain every run (plan.json stays frozen)")
    p.add_argument(
        "--report-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="rebuild DIR/report.md and its figures from DIR/results.json alone; every other option is ignored",
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
    hw.add_argument("--threads", type=int, default=None, help="torch CPU threads with --workers 1 (default: torch's)")
    hw.add_argument("--progress-bar", action="store_true", help="show Lightning's progress bar")
    add_launcher_arguments(p)
    return p


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


def pilot_setup(pilot: Pilot) -> StudySetup:
    """The pilot's data, validation batches and hardware: its command line (``meta["command"]``) parsed again by the
    study's own parser. The model and the budget come from its runs' specs (``confirmation_specs``); a command that
    no longer gives the data the pilot recorded (the study's defaults changed since) is a ``ValueError``."""
    argv = shlex.split(str(pilot.record.meta["command"]))[len(shlex.split(COMMAND_PREFIX)) :]
    try:
        setup = prepare(argv)
    except SystemExit as exc:  # argparse has printed why
        raise ValueError(f"the pilot's command no longer parses: {shlex.join(argv)}") from exc
    meta = pilot.record.meta
    problems = [
        f"{key} {getattr(setup.budget, key)} where the pilot recorded {meta[key]}"
        for key in ("seq_len", "batch_size")
        if key in meta and getattr(setup.budget, key) != meta[key]
    ]
    if problems:
        raise ValueError(f"the pilot's command no longer gives its data settings: {'; '.join(problems)}")
    return setup


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the confirmation; 0 when every run finished or diverged, 1 when a run failed with an error, 2 on bad
    arguments (one message naming each problem, before any work)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from bhyt_pl.machine import machine_info

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.report_from is not None:
            paths = report_from(args.report_from)
            log.info("confirmation report rebuilt from %s: %s", paths["results"], paths["report"])
            return 0
        _check(args)
        pilot = load_pilot(args.pilot)
        setup = pilot_setup(pilot)
        out = args.out if args.out is not None else args.pilot / "confirmation"
        plan_path = out / PLAN_FILE
        if args.plan_only and not plan_path.exists():
            rate = pilot.rate(args.rate)
            max_seeds = power.MAX_SEEDS if args.max_seeds is None else args.max_seeds
            plan = make_confirmation_plan(pilot, rate, max_seeds, args.seeds)
        else:
            plan = frozen_plan(plan_path, pilot, args.rate, args.max_seeds, args.seeds)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    frozen = "frozen in " + str(plan_path) if plan_path.exists() else "not written: --plan-only"
    print(plan.render() + f"\n\n(plan {frozen})", flush=True)
    if args.plan_only:
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    pilot_settings = replace(setup.settings, compile=bool(pilot.record.meta.get("compile", setup.settings.compile)))
    settings = _settings(pilot_settings, args)
    launch_args = argparse.Namespace(**{**vars(args), "accelerator": settings.accelerator})
    try:
        workers = check_launcher(launch_args)  # bad workers, devices or cluster settings: before any run
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = out if args.launcher == "pool" else out.absolute()  # a cluster's jobs run from other directories
    specs = confirmation_specs(plan, pilot)
    meta = {
        "kind": KIND,
        "command": "python -m bhyt_pl study confirm " + shlex.join(argv),
        "pilot": str(pilot.folder),
        "pilot_results_sha256": pilot.sha256,
        "pilot_command": pilot.record.meta["command"],
        "rate": float(plan.source["rate"]),
        "preset": pilot.record.meta.get("preset"),
        "n_layers_label": pilot.record.meta.get("n_layers_label"),
        "steps": pilot.record.meta.get("steps"),
        "tokens_per_step": pilot.record.meta.get("tokens_per_step"),
        "tokens_per_run": pilot.record.meta.get("tokens_per_run"),
        "runs_planned": len(specs),
        "seed_indices": sorted({spec.seed_index for spec in specs}),
        "workers": workers,
        "launcher": args.launcher,
        "compile": settings.compile,
        "loadavg_at_start": loadavg_text(),
        "machine": machine_info(torch.device("cuda" if settings.accelerator in ("gpu", "cuda") else "cpu")),
    }
    invocation = Invocation.resume(out, restart=args.restart)  # the wall time of earlier invocations carries over
    started = time.perf_counter()
    run = partial(
        runner.run_one,
        datamodule_factory=setup.data,
        val_batches=setup.validation_batches(),
        settings=settings,
        out_dir=out,
    )
    try:
        launcher = make_launcher(launch_args, run, out, workers)
    except ValueError as exc:  # another driver holds the folder; SLURM's tools missing
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scheduler = Scheduler(launcher, out, resume=not args.restart)
    results: list[RunResult] = []
    record = ConfirmationRecord(meta, plan, results)

    def on_result(result: RunResult) -> None:
        results.append(result)
        elapsed = time.perf_counter() - started
        log.info(progress_line(len(results), len(specs), elapsed, len(scheduler.reused), counts=scheduler.counts()))
        log.info(
            "  %s: %s, val loss %.4f, %.0f s", result.spec.label, result.status, result.val_loss, result.wall_seconds
        )
        invocation.record(meta, len(results), len(specs))  # the report says it is partial: k of N runs
        if rank_zero_only.rank == 0:  # the record after every run: a stopped confirmation keeps what it measured
            write_report(out, record, figures=False)

    finished, paths = False, None
    try:
        results[:] = run_all(specs, scheduler, on_result)
        finished = True
    except KeyboardInterrupt:
        pass  # reported below, after the partial report is written
    finally:
        launcher.close()
        invocation.record(meta, len(results), len(specs), outcome="finished" if finished else "interrupted")
        meta["runs_reused"] = len(scheduler.reused)
        meta["loadavg_at_end"] = loadavg_text()
        # not after a stop before the first result: that would replace a previous invocation's record with an
        # empty one (its runs are still in runs/ and are read back next time)
        if rank_zero_only.rank == 0 and (results or not specs):
            paths = write_report(out, record)
    if not finished:
        where = interrupted_runs(args.launcher)
        kept = f"partial report: {paths['report']}" if paths else "nothing finished, no report written"
        log.warning("confirmation interrupted after %.0f s, %d of %d runs done; %s", invocation.seconds,
                    len(results), len(specs), kept)  # fmt: skip
        log.warning("%s; the same command resumes it, reusing every finished run", where)
        return 130
    if paths is not None:
        invocations = len(meta["invocations"])
        total = f" ({meta['wall_seconds']:.0f} s over {invocations} invocations)" if invocations > 1 else ""
        log.info("confirmation finished in %.0f s%s; report: %s", invocation.seconds, total, paths["report"])
    return 1 if any(r.status == RunStatus.ERROR for r in results) else 0

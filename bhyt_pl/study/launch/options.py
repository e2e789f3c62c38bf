"""Where a study's runs train, chosen on the command line: ``--launcher pool|local|slurm``.

- ``pool`` (default): this machine, ``--workers`` runs at once in a process pool (one run after another in
  this process with ``--workers 1``); with a GPU accelerator each worker owns one GPU (``bhyt_pl.study.launch.pool``).
- ``local``: every run is a job of submitit's local executor: a process of its own that survives this driver,
  checkpoints on preemption and is found again by a restarted driver; the same code path as a cluster.
- ``slurm``: every run is a SLURM job (job arrays), submitted with submitit
(``bhyt_pl.study.launch.submitit_launcher``).

The cluster options follow submitit's ``AutoExecutor`` names (``ClusterSettings``). This module turns the parsed
options into a ``Launcher`` for the study's scheduler; ``study`` and ``study confirm`` share it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.launcher import Launcher
from bhyt_pl.study.launch.pool import InlineLauncher, ProcessPoolLauncher, local_workers
from bhyt_pl.study.launch.submitit_launcher import ClusterSettings, SubmititLauncher
from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = [
    "LAUNCHERS",
    "add_launcher_arguments",
    "check_launcher",
    "cluster_settings",
    "interrupted_runs",
    "make_launcher",
    "study_name",
]

LAUNCHERS = ("pool", "local", "slurm")

_DEFAULTS = ClusterSettings()


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's options, in their own group of ``--help``."""
    g = parser.add_argument_group(
        "launcher (where the runs train; cluster options follow submitit's AutoExecutor, see README 'The study on a "
        "cluster')"
    )
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="pool",
        help="pool: this machine, --workers at once; local: each run a submitit job on this machine (survives "
        "the driver, resumes on preemption); slurm: each run a SLURM job",
    )
    g.add_argument("--partition", default=None, help="SLURM partition")
    g.add_argument("--account", default=None, help="SLURM account charged")
    g.add_argument("--qos", default=None, help="SLURM quality of service")
    g.add_argument(
        "--timeout-min",
        type=int,
        default=_DEFAULTS.timeout_min,
        help="time limit of one run's job in minutes; a run that reaches it saves, is requeued and resumes",
    )
    g.add_argument(
        "--gpus-per-run", type=int, default=None, help="GPUs per run's job (default: 1 with a GPU accelerator, else 0)"
    )
    g.add_argument(
        "--cpus-per-task", type=int, default=_DEFAULTS.cpus_per_task, help="CPUs per run's job; torch's threads follow"
    )
    g.add_argument("--mem-gb", type=float, default=None, help="memory per run's job in GB (default: the partition's)")
    g.add_argument(
        "--sbatch",
        nargs="*",
        default=[],
        metavar="FLAG=VALUE",
        help="extra #SBATCH lines, e.g. --sbatch constraint=a100 mail-type=FAIL (a bare FLAG: a flag alone)",
    )
    g.add_argument("--setup", nargs="*", default=[], metavar="LINE", help="shell lines each job runs first")
    g.add_argument("--max-concurrent", type=int, default=0, help="most runs of the study running at once (0: no cap)")
    g.add_argument(
        "--retries", type=int, default=_DEFAULTS.retries, help="tries after a run's first fails (crash, kill, lost job)"
    )
    g.add_argument(
        "--lost-after-s",
        type=float,
        default=_DEFAULTS.lost_after_s,
        help="a job with no accounting entry and no result for this long is lost and resubmitted",
    )
    g.add_argument(
        "--poll-interval-s", type=float, default=_DEFAULTS.poll_interval_s, help="seconds between two sacct calls"
    )
    g.add_argument(
        "--signal-delay-s",
        type=int,
        default=_DEFAULTS.signal_delay_s,
        help="seconds before the time limit at which SLURM signals a job to save and requeue",
    )


def _sbatch_lines(items: list[str]) -> dict[str, Any]:
    lines: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key:
            raise UsageError(f"--sbatch {item!r} must be FLAG=VALUE or FLAG, e.g. --sbatch constraint=a100")
        lines[key] = value if eq else True
    return lines


def cluster_settings(args: argparse.Namespace) -> ClusterSettings | None:
    """The submitit settings of ``--launcher local|slurm``; None for the pool. Bad values: one ``UsageError``."""
    if args.launcher == "pool":
        return None
    gpus = args.gpus_per_run
    if gpus is None:
        gpus = 1 if str(args.accelerator).lower() in ("gpu", "cuda") else 0
    try:
        return ClusterSettings(
            cluster=args.launcher,
            partition=args.partition,
            account=args.account,
            qos=args.qos,
            timeout_min=args.timeout_min,
            gpus_per_node=gpus,
            cpus_per_task=args.cpus_per_task,
            mem_gb=args.mem_gb,
            additional_parameters=_sbatch_lines(args.sbatch),
            setup=tuple(args.setup),
            max_concurrent=args.max_concurrent,
            retries=args.retries,
            lost_after_s=args.lost_after_s,
            poll_interval_s=args.poll_interval_s,
            signal_delay_s=args.signal_delay_s,
        )
    except ValueError as exc:
        # ClusterSettings names its fields; say them as the flags the user typed
        text = re.sub(r"\b(gpus_per_node)\b", "--gpus-per-run", str(exc))
        for name in ("timeout_min", "cpus_per_task", "max_concurrent", "retries", "mem_gb", "lost_after_s",
                     "poll_interval_s", "signal_delay_s"):  # fmt: skip
            text = text.replace(name, "--" + name.replace("_", "-"))
        raise UsageError(text) from exc


def check_launcher(args: argparse.Namespace) -> int:
    """Checks the launcher's options before any work and returns the pool's worker count (1 for a cluster: its
    jobs run alone). Bad values raise one ``UsageError`` naming the flag."""
    if cluster_settings(args) is not None:
        return 1
    return local_workers(args.accelerator, args.workers, args.devices)[0]


def interrupted_runs(launcher: str) -> str:
    """What becomes of the runs in training when the driver is interrupted, for its last line before it exits."""
    if launcher == "pool":
        return "this machine's workers stop"
    if launcher == "local":
        # submitit starts a local job's processes in the driver's process group: a terminal's Ctrl-C reaches them
        return "its local jobs go on unless the interrupt reached them too (a Ctrl-C in the terminal does)"
    return "its queued and running jobs go on"


def study_name(out: Path) -> str:
    """The jobs' name: ``bhyt-<study folder name>``, so ``squeue --name`` finds a study's jobs."""
    name = re.sub(r"[^\w.@:+=-]+", "-", Path(out).absolute().name).strip("-") or "study"
    return f"bhyt-{name}"


def make_launcher(
    args: argparse.Namespace, run: Callable[[RunSpec], RunResult], out: Path, workers: int | None
) -> Launcher:
    """The launcher ``args`` asks for, training ``run`` for the study in ``out``.

    Args:
        args: the parsed options (``add_launcher_arguments`` and ``--accelerator``).
        run: the run function, picklable (a worker or a job calls it).
        out: the study folder; a cluster's jobs write there, so it must be on a filesystem they share.
        workers: runs at once in the pool (``--workers``; None: ``local_workers``' default); the cluster launchers
            ignore it.
    """
    settings = cluster_settings(args)
    if settings is None:
        count, devices = local_workers(args.accelerator, workers, args.devices)
        if count == 1:  # in this process; with a GPU accelerator its run takes the first visible GPU
            return InlineLauncher(run)
        return ProcessPoolLauncher(run, count, devices=devices)
    return SubmititLauncher(settings, Path(out).absolute(), study_name(out), run)

"""Where a study's runs train, chosen on the command line: ``--launcher pool|local|slurm``.

- ``pool`` (default): this machine, ``--workers`` runs at once in a process pool (``bhyt_pl.study.launch.pool``;
  one run after another in this process with ``--workers 1``, ``bhyt_pl.study.launch.inline``); with a GPU
  accelerator each worker owns one GPU.
- ``local``: every run is a job of submitit's local executor (``bhyt_pl.study.launch.submitit_local``): a process
  of its own that survives this driver, checkpoints on preemption and is found again by a restarted driver; the
  same code path as a cluster.
- ``slurm``: every run is a SLURM job (job arrays), submitted with submitit (``bhyt_pl.study.launch.slurm``).

The cluster options follow submitit's ``AutoExecutor`` names (``bhyt_pl.study.launch.cluster_settings``). This
module turns the parsed options (``LaunchOptions``) into a ``Launcher`` for the study's scheduler; ``study`` and
``study confirm`` share it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.cluster_settings import ClusterSettings, SbatchLines
from bhyt_pl.study.launch.inline import InlineLauncher
from bhyt_pl.study.launch.launcher import Launcher
from bhyt_pl.study.launch.pool import ProcessPoolLauncher, local_workers
from bhyt_pl.study.launch.slurm import SlurmLauncher
from bhyt_pl.study.launch.submitit_base import SubmititLauncher
from bhyt_pl.study.launch.submitit_local import LocalJobLauncher
from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = [
    "LAUNCHERS",
    "LaunchOptions",
    "add_launcher_arguments",
    "check_launcher",
    "cluster_settings",
    "interrupted_runs",
    "make_launcher",
    "study_folder",
    "study_name",
]

POOL = "pool"
SUBMITIT_LAUNCHERS: dict[str, type[SubmititLauncher]] = {"local": LocalJobLauncher, "slurm": SlurmLauncher}
"""``--launcher`` choices that run each run as a submitit job: the launcher class of each (it names its settings)."""
LAUNCHERS = (POOL, *SUBMITIT_LAUNCHERS)

_DEFAULTS = ClusterSettings()

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher's options as the command line gives them (``add_launcher_arguments``, and ``--accelerator``,
    ``--devices``, ``--workers`` of the study's hardware group); field names are the flags' argparse dests."""

    launcher: str = POOL
    workers: int | None = None
    accelerator: str = "cpu"
    devices: int | str | None = "1"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    timeout_min: int = _DEFAULTS.timeout_min
    gpus_per_run: int | None = None
    cpus_per_task: int = _DEFAULTS.cpus_per_task
    mem_gb: float | None = None
    sbatch: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    max_concurrent: int = _DEFAULTS.max_concurrent
    retries: int = _DEFAULTS.retries
    lost_after_s: float = _DEFAULTS.lost_after_s
    poll_interval_s: float = _DEFAULTS.poll_interval_s
    signal_delay_s: int = _DEFAULTS.signal_delay_s

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        object.__setattr__(self, "sbatch", tuple(self.sbatch))
        object.__setattr__(self, "setup", tuple(self.setup))

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> LaunchOptions:
        """The options among ``values`` (``vars(args)``: other keys are ignored; a missing one keeps its default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})  # type: ignore[arg-type]


def add_launcher_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's options, in their own group of ``--help``."""
    g = parser.add_argument_group(
        "launcher (where the runs train; cluster options follow submitit's AutoExecutor, see "
        "docs/tutorials/depth-study.md, 'On GPUs and on a cluster')"
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


def _sbatch_lines(items: tuple[str, ...]) -> SbatchLines:
    lines: SbatchLines = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key:
            raise UsageError(f"--sbatch {item!r} must be FLAG=VALUE or FLAG, e.g. --sbatch constraint=a100")
        lines[key] = value if eq else True
    return lines


def _settings_values(options: LaunchOptions) -> dict[str, object]:
    """Every cluster setting the options give, by ``ClusterSettings``' field names (each executor picks its own)."""
    gpus = options.gpus_per_run
    if gpus is None:
        gpus = 1 if str(options.accelerator).lower() in ("gpu", "cuda") else 0
    return {
        "partition": options.partition,
        "account": options.account,
        "qos": options.qos,
        "timeout_min": options.timeout_min,
        "gpus_per_node": gpus,
        "cpus_per_task": options.cpus_per_task,
        "mem_gb": options.mem_gb,
        "additional_parameters": _sbatch_lines(options.sbatch),
        "setup": options.setup,
        "max_concurrent": options.max_concurrent,
        "retries": options.retries,
        "lost_after_s": options.lost_after_s,
        "poll_interval_s": options.poll_interval_s,
        "signal_delay_s": options.signal_delay_s,
    }


def _settings(options: LaunchOptions) -> tuple[ClusterSettings, list[str]] | None:
    """The submitit settings of ``--launcher local|slurm`` and the options its executor ignores; None for the pool."""
    launcher = SUBMITIT_LAUNCHERS.get(options.launcher)
    if launcher is None:
        return None
    try:
        return launcher.settings_class.from_values(_settings_values(options))
    except ValueError as exc:
        # the settings name their fields; say them as the flags the user typed
        text = re.sub(r"\b(gpus_per_node)\b", "--gpus-per-run", str(exc))
        for name in ("timeout_min", "cpus_per_task", "max_concurrent", "retries", "mem_gb", "lost_after_s",
                     "poll_interval_s", "signal_delay_s"):  # fmt: skip
            text = text.replace(name, "--" + name.replace("_", "-"))
        raise UsageError(text) from exc


def cluster_settings(options: LaunchOptions) -> ClusterSettings | None:
    """The submitit settings of ``--launcher local|slurm`` (``LocalSettings``, ``SlurmSettings``); None for the
    pool. Bad values: one ``UsageError`` naming the flag."""
    settings = _settings(options)
    return None if settings is None else settings[0]


def check_launcher(options: LaunchOptions) -> int:
    """Checks the launcher's options before any work and returns the pool's worker count (1 for a cluster: its
    jobs run alone). Bad values raise one ``UsageError`` naming the flag."""
    if cluster_settings(options) is not None:
        return 1
    return local_workers(options.accelerator, options.workers, options.devices)[0]


def interrupted_runs(launcher: str) -> str:
    """What becomes of the runs in training when the driver is interrupted, for its last line before it exits."""
    submitit_launcher = SUBMITIT_LAUNCHERS.get(launcher)
    return "this machine's workers stop" if submitit_launcher is None else submitit_launcher.interrupted_runs


def study_folder(options: LaunchOptions, out: Path) -> Path:
    """``out`` as the runs must be told it: absolute for a job launcher, whose jobs start in another working
    directory (another node's), as given for this machine's pool."""
    return out if cluster_settings(options) is None else out.absolute()


def study_name(out: Path) -> str:
    """The jobs' name: ``bhyt-<study folder name>``, so ``squeue --name`` finds a study's jobs."""
    name = re.sub(r"[^\w.@:+=-]+", "-", Path(out).absolute().name).strip("-") or "study"
    return f"bhyt-{name}"


def make_launcher(
    options: LaunchOptions, run: Callable[[RunSpec], RunResult], out: Path, workers: int | None
) -> Launcher:
    """The launcher ``options`` ask for, training ``run`` for the study in ``out``.

    Args:
        options: the launcher's options.
        run: the run function, picklable (a worker or a job calls it).
        out: the study folder; a cluster's jobs write there, so it must be on a filesystem they share.
        workers: runs at once in the pool (``check_launcher``'s count; None: ``local_workers``' default); the
            cluster launchers ignore it.
    """
    chosen = _settings(options)
    if chosen is None:
        count, devices = local_workers(options.accelerator, workers, options.devices)
        if count == 1:  # in this process; with a GPU accelerator its run takes the first visible GPU
            return InlineLauncher(run)
        return ProcessPoolLauncher(run, count, devices=devices)
    settings, ignored = chosen
    for name in ignored:
        log.warning("cluster settings: %s is ignored by the %s executor", name, settings.executor)
    return SUBMITIT_LAUNCHERS[options.launcher](settings, Path(out).absolute(), study_name(out), run)

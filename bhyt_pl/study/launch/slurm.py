"""The study's runs as SLURM jobs (``--launcher slurm``): job arrays submitted with submitit, observed with ``sacct``.

``SlurmLauncher`` is the ``SubmititLauncher`` (``bhyt_pl.study.launch.submitit_base``) of a SLURM cluster: it submits
every pending run as one job array whose ``%N`` throttle keeps the study under ``max_concurrent``, reads the jobs'
states from ``sacct`` (submitit's source of truth; it reads nothing else) every ``poll_interval_s``, and maps them
as ``bhyt_pl.study.launch.job_states`` says. Inside a job, torch's threads follow SLURM's ``SLURM_CPUS_PER_TASK``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import submitit
from submitit.slurm.slurm import SlurmInfoWatcher

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.cluster_settings import SlurmSettings
from bhyt_pl.study.launch.job_states import JobPhase, slurm_phase
from bhyt_pl.study.launch.submitit_base import SubmititLauncher
from bhyt_pl.study.launch.submitit_job import CheckpointableRun

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = ["SlurmLauncher", "SlurmRun", "sacct_states"]

log = logging.getLogger(__name__)


class SlurmRun(CheckpointableRun):
    """A ``CheckpointableRun`` in a SLURM job: torch's threads follow the CPUs SLURM gave the job
    (``SLURM_CPUS_PER_TASK``: an ``--sbatch cpus-per-task=N`` line may change them), else the settings'."""

    def threads(self) -> int:
        cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
        return int(cpus) if cpus.isdigit() else self.cpus_per_task


def sacct_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """``sacct``'s State of each job, first word (absent: no accounting entry), or None when sacct did not answer.

    The command and its parsing are submitit's (``SlurmInfoWatcher``); the launcher calls it on its own schedule,
    because the watcher stops asking about a job it believes done (a ``SUSPENDED`` one, say).
    """
    command = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]
    for array in sorted({job_id.split("_")[0] for job_id in job_ids}):
        command += ["-j", array]
    try:
        output = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sacct did not answer (%s); job states unchanged", exc)
        return None
    # "CANCELLED by 1234" -> CANCELLED
    return {
        job_id: info.get("State", "").split(" ")[0] for job_id, info in SlurmInfoWatcher().read_info(output).items()
    }


class SlurmLauncher(SubmititLauncher):
    """Runs a study's runs as SLURM job arrays (module docstring).

    Args:
        settings: partition, account, resources, throttle, retries and timings.
        folder: the study folder, on a filesystem the jobs share.
        study: the jobs' name (``squeue --name``, ``scancel --name``).
        run: the run function, picklable.

    Raises:
        UsageError: SLURM's tools are not on PATH, or the base class's reasons.
    """

    settings_class: ClassVar[type[SlurmSettings]] = SlurmSettings
    interrupted_runs: ClassVar[str] = "its queued and running jobs go on"

    def _make_executor(self, folder: Path) -> submitit.Executor:
        try:
            return submitit.AutoExecutor(folder=folder, cluster=SlurmSettings.executor)
        except RuntimeError as exc:  # SlurmExecutor looks for srun on PATH
            raise UsageError(f"cluster 'slurm' needs SLURM's tools on PATH ({exc}); cluster 'local' runs here") from exc

    def _job_function(self, run: Callable[[RunSpec], RunResult]) -> CheckpointableRun:
        return SlurmRun(run, self.settings.cpus_per_task, self.settings.signal_delay_s / 2)

    def _job(self, job_id: str) -> submitit.Job:
        return submitit.SlurmJob(folder=self.folder / "jobs" / "%j", job_id=job_id)

    def _batch(self, free: float, pending: int) -> tuple[int, int]:
        # SLURM queues a whole array and starts its tasks `throttle` at a time
        throttle = int(min(free, pending))
        self.executor.update_parameters(slurm_array_parallelism=throttle)
        return pending, throttle

    def _states_due(self, now: float) -> bool:
        return now - self._last_state_read >= self.settings.poll_interval_s  # one sacct call per interval

    def _job_states(self, jobs: Sequence[submitit.Job]) -> dict[str, str] | None:
        return sacct_states([job.job_id for job in jobs])

    def _phase(self, state: str) -> JobPhase:
        return slurm_phase(state)

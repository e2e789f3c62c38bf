"""The study's runs as jobs of submitit's local executor (``--launcher local``): one process per run on this machine.

``LocalJobLauncher`` is the ``SubmititLauncher`` (``bhyt_pl.study.launch.submitit_base``) of submitit's
``LocalExecutor``: the same code path as a cluster (a job survives the driver, checkpoints on preemption and is
found again by a restarted driver), with no queue and no accounting. It submits only as many jobs as may run under
``max_concurrent`` (the local executor starts every job it gets at once), and a job runs while its controller
process does (``psutil`` finds an earlier driver's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import psutil
import submitit

from bhyt_pl.study.launch.cluster_settings import LocalSettings
from bhyt_pl.study.launch.job_states import LOCAL_ENDED, JobPhase, local_phase
from bhyt_pl.study.launch.submitit_base import SubmititLauncher

__all__ = ["LocalJobLauncher"]


class LocalJobLauncher(SubmititLauncher):
    """Runs a study's runs as local submitit jobs (module docstring).

    Args:
        settings: time limit, CPUs and GPUs per run, throttle, retries and timings.
        folder: the study folder (``jobs.jsonl`` and submitit's ``jobs/<job id>/``).
        study: the jobs' name.
        run: the run function, picklable.
    """

    settings_class: ClassVar[type[LocalSettings]] = LocalSettings
    # submitit starts a local job's processes in the driver's process group: a terminal's Ctrl-C reaches them
    interrupted_runs: ClassVar[str] = (
        "its local jobs go on unless the interrupt reached them too (a Ctrl-C in the terminal does)"
    )

    def _make_executor(self, folder: Path) -> submitit.Executor:
        return submitit.AutoExecutor(folder=folder, cluster=LocalSettings.executor)

    def _job(self, job_id: str) -> submitit.Job:
        return submitit.LocalJob(folder=self.folder / "jobs" / "%j", job_id=job_id)

    def _batch(self, free: float, pending: int) -> tuple[int, int]:
        count = int(min(free, pending))  # every job it gets starts at once: only as many as may run
        return count, count

    def _job_states(self, jobs: Sequence[submitit.Job]) -> dict[str, str]:
        return {job.job_id: self._local_state(job) for job in jobs}

    def _phase(self, state: str) -> JobPhase:
        return local_phase(state)

    def _local_state(self, job: submitit.Job) -> str:
        """A local job's state: ``RUNNING`` while its controller process runs (this driver's child, or an earlier
        driver's), then ``FINISHED`` (or ``INTERRUPTED``: the controller was killed)."""
        state = job.state  # submitit knows only the processes this driver started
        if state in ("RUNNING", *LOCAL_ENDED):
            return state
        try:
            process = psutil.Process(int(job.job_id))
            alive = (
                process.status() != psutil.STATUS_ZOMBIE
                and "submitit.local._local" in process.cmdline()
                and str(self.folder) in " ".join(process.cmdline())
            )
        except (psutil.Error, ValueError):
            alive = False
        return "RUNNING" if alive else "FINISHED"

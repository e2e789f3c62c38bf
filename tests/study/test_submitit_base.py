"""The machinery every submitit launcher shares (``bhyt_pl.study.launch.submitit_base.SubmititLauncher``), driven
through a scripted subclass: its jobs never run, and their states are whatever the test says. The base turns those
states into run events, fails a try whose job ended without a result or was lost, and resubmits it while tries
are left, recording each step in ``jobs.jsonl``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
import submitit
from submitit.core.utils import JobPaths

from bhyt_pl.study.launch.cluster_settings import ClusterSettings, LocalSettings
from bhyt_pl.study.launch.job_records import JobRecords
from bhyt_pl.study.launch.job_states import JobPhase, slurm_phase
from bhyt_pl.study.launch.launcher import RunState
from bhyt_pl.study.launch.submitit_base import SubmititLauncher
from bhyt_pl.study.protocol.spec import RunSpec


class ScriptedJob:
    """A job that never runs: its id, submitit's paths for it (no result file unless a test writes one), cancels."""

    def __init__(self, folder: Path, job_id: str) -> None:
        self.job_id = job_id
        self.paths = JobPaths(folder, job_id=job_id, task_id=0)
        self.cancelled = False

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


class ScriptedExecutor:
    def __init__(self, folder: Path) -> None:
        self.folder, self.submitted, self.parameters = folder, 0, {}

    def update_parameters(self, **parameters: object) -> None:
        self.parameters.update(parameters)

    def map_array(self, function: Callable, specs: Sequence[RunSpec]) -> list[ScriptedJob]:
        jobs = [ScriptedJob(self.folder, str(100 + self.submitted + i)) for i in range(len(specs))]
        self.submitted += len(specs)
        return jobs


class ScriptedLauncher(SubmititLauncher):
    """States from ``self.states`` (job id -> SLURM's word), read on every poll; every pending run at once."""

    settings_class: ClassVar[type[ClusterSettings]] = LocalSettings
    states: dict[str, str]

    def _make_executor(self, folder: Path) -> submitit.Executor:
        self.states = {}
        self.jobs: dict[str, ScriptedJob] = {}
        return ScriptedExecutor(folder)  # type: ignore[return-value]

    def _job(self, job_id: str) -> submitit.Job:
        return ScriptedJob(self.folder / "jobs" / "%j", job_id)  # type: ignore[return-value]

    def _batch(self, free: float, pending: int) -> tuple[int, int]:
        return pending, pending

    def _job_states(self, jobs: Sequence[submitit.Job]) -> dict[str, str]:
        self.jobs.update({job.job_id: job for job in jobs})  # type: ignore[misc]
        return {job.job_id: self.states[job.job_id] for job in jobs if job.job_id in self.states}

    def _phase(self, state: str) -> JobPhase:
        return slurm_phase(state)


SETTINGS = LocalSettings(result_wait_s=1e-9, lost_after_s=1e-9, retries=1)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[ScriptedLauncher]:
    with ScriptedLauncher(SETTINGS, tmp_path / "study", "s", len) as chosen:
        yield chosen


def _events(launcher: ScriptedLauncher) -> list[tuple[str, RunState]]:
    return [(e.spec.label, e.state) for e in launcher.poll(0)]


def test_states_become_run_events_once_each(launcher: ScriptedLauncher) -> None:
    launcher.start([RunSpec("a", "rmsnorm"), RunSpec("b", "rmsnorm")])
    launcher.states.update({"100": "PENDING", "101": "RUNNING"})
    queued = [("a", RunState.QUEUED), ("b", RunState.QUEUED)]  # submitted by start
    assert _events(launcher) == [*queued, ("b", RunState.RUNNING)]
    assert _events(launcher) == []  # nothing changed
    launcher.states["100"] = "SOMETHING_NEW"  # unknown: taken as queued, so no news
    assert _events(launcher) == []
    launcher.states["100"] = "COMPLETING"
    assert _events(launcher) == [("a", RunState.RUNNING)]


def test_a_job_that_ended_without_a_result_fails_a_try_then_the_run(launcher: ScriptedLauncher) -> None:
    launcher.start([RunSpec("a", "rmsnorm")])
    launcher.states["100"] = "FAILED"
    assert _events(launcher) == [("a", RunState.QUEUED)]  # the end is seen; its result waited on for result_wait_s
    assert _events(launcher) == [] and launcher.executor.submitted == 2  # try 2: queued still
    launcher.states["101"] = "OUT_OF_MEMORY"
    launcher.poll(0)
    (failed,) = launcher.poll(0)
    assert failed.state == RunState.FAILED and failed.error.startswith("failed all 2 tries: try 1 (job 100): the job")
    assert "try 2 (job 101): the job ended (OUT_OF_MEMORY) without a result" in failed.error
    records = [(r.event, r.job_id, r.attempt) for r in JobRecords(launcher.folder).read()]
    assert records == [("submitted", "100", 1), ("failed", "100", 1), ("submitted", "101", 2), ("failed", "101", 2)]


def test_a_lost_job_is_cancelled_before_its_retry(launcher: ScriptedLauncher) -> None:
    launcher.start([RunSpec("a", "rmsnorm")])
    launcher.poll(0)  # no entry: missing since now
    launcher.poll(0)  # and lost after lost_after_s
    assert launcher.jobs["100"].cancelled and launcher.executor.submitted == 2
    (record,) = [r for r in JobRecords(launcher.folder).read() if r.event == "failed"]
    assert record.error.startswith("lost: no accounting entry and no result for")


def test_the_base_leaves_the_executor_to_a_subclass(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError):
        SubmititLauncher(ClusterSettings(), tmp_path / "study", "s", len)

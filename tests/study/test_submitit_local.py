"""``LocalJobLauncher`` (``bhyt_pl.study.launch.submitit_local``): submitit's local executor starts every job it gets,
so it gets only as many as may run; a job runs while its controller process does, also an earlier driver's, which
it finds by the controller's command line. The runs themselves: tests/study/test_slurm.py (real local jobs)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import submitit

from bhyt_pl.study.launch.cluster_settings import LocalSettings, SlurmSettings
from bhyt_pl.study.launch.job_states import JobPhase
from bhyt_pl.study.launch.submitit_local import LocalJobLauncher


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LocalJobLauncher]:
    with LocalJobLauncher(LocalSettings(timeout_min=5), tmp_path / "study", "s", len) as chosen:
        yield chosen


def test_it_submits_only_the_jobs_that_may_run_now(launcher: LocalJobLauncher) -> None:
    assert launcher._batch(2, 5) == (2, 2)
    assert launcher._batch(float("inf"), 3) == (3, 3)  # no cap: every pending run at once
    assert isinstance(launcher.executor, submitit.AutoExecutor) and launcher.executor.cluster == "local"


def test_a_job_runs_while_a_controller_of_this_study_runs(launcher: LocalJobLauncher, tmp_path: Path) -> None:
    """An earlier driver's controller (a process submitit does not know here) is found by its command line; a
    process that is no controller of this study's jobs, or none at all, is a finished job."""
    ours = [sys.executable, "-c", "import time; time.sleep(120)", "submitit.local._local", str(launcher.folder)]
    other = [sys.executable, "-c", "import time; time.sleep(120)", "submitit.local._local", str(tmp_path / "other")]
    processes = [subprocess.Popen(ours), subprocess.Popen(other)]
    try:
        jobs = [launcher._job(str(p.pid)) for p in processes] + [launcher._job("not-a-pid")]
        states = launcher._job_states(jobs)
        assert list(states.values()) == ["RUNNING", "FINISHED", "FINISHED"]
        assert [launcher._phase(s) for s in states.values()] == [JobPhase.RUNNING, JobPhase.ENDED, JobPhase.ENDED]
        assert isinstance(jobs[0], submitit.LocalJob)
        processes[0].kill()
        processes[0].wait()
        assert launcher._job_states(jobs[:1]) == {str(processes[0].pid): "FINISHED"}
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_it_takes_the_local_executors_settings_only(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="LocalJobLauncher needs LocalSettings, got SlurmSettings"):
        LocalJobLauncher(SlurmSettings(), tmp_path / "study", "s", len)

"""The callable every submitit job of the study runs (``bhyt_pl.study.launch.submitit_job.CheckpointableRun``): its
threads, and what a requeued job runs. Its signal handling inside a job: tests/study/test_slurm.py and
tests/study/test_preemption.py."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import torch
from submitit.core.utils import DelayedSubmission

from bhyt_pl.study.launch.submitit_job import TERMINATED_EXIT_CODE, CheckpointableRun
from bhyt_pl.study.protocol.spec import RunResult, RunSpec


@pytest.fixture
def torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def threads_run(spec: RunSpec) -> RunResult:
    return RunResult(spec, steps_done=torch.get_num_threads())


def test_the_run_gets_the_settings_cpus_as_torch_threads(torch_threads, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")  # a local job inside a SLURM allocation: not its own CPUs
    assert CheckpointableRun(threads_run, cpus_per_task=3)(RunSpec("a", "rmsnorm")).steps_done == 3


def test_a_requeued_job_runs_the_same_callable_on_the_same_spec() -> None:
    job = CheckpointableRun(threads_run, cpus_per_task=2, grace_s=5.0)
    spec = RunSpec("a", "rmsnorm", lr=0.5)
    again = job.checkpoint(spec)
    assert isinstance(again, DelayedSubmission) and again.function is job and again.args == (spec,)
    copy = pickle.loads(pickle.dumps(job))  # submitit pickles the callable into the job's folder
    assert (copy.run, copy.cpus_per_task, copy.grace_s) == (threads_run, 2, 5.0)
    assert TERMINATED_EXIT_CODE == 143

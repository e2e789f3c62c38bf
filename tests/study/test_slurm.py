"""``SlurmLauncher`` (and the job side it shares with ``LocalJobLauncher``) against a fake SLURM on PATH
(tests/study/fake_slurm: ``sbatch`` runs the generated script here, ``sacct`` answers from the fake's state) and
against submitit's local executor, with cheap run functions (``fake_slurm.jobs``) that jobs import by name. Tests
marked ``slow`` start real job processes (each pays a Python and torch start); the others hold the fake's jobs in its
queue (``FAKE_SLURM_HOLD``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import submitit
import torch
from fake_slurm.cluster import FakeSlurm
from fake_slurm.jobs import expected_loss, quick_run, stepped_loss, stepped_run

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.cluster_settings import LocalSettings, SlurmSettings
from bhyt_pl.study.launch.job_records import JobRecords
from bhyt_pl.study.launch.job_states import JobPhase
from bhyt_pl.study.launch.launcher import Launcher, RunEvent, RunState
from bhyt_pl.study.launch.slurm import SlurmLauncher, SlurmRun, sacct_states
from bhyt_pl.study.launch.submitit_base import SubmititLauncher
from bhyt_pl.study.launch.submitit_job import TERMINATED_EXIT_CODE, CheckpointableRun
from bhyt_pl.study.launch.submitit_local import LocalJobLauncher
from bhyt_pl.study.protocol.spec import RunSpec
from bhyt_pl.study.run.preemption import RunPreempted, preemption_requested

HERE = Path(__file__).resolve().parent
FINAL = (RunState.DONE, RunState.FAILED)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlurm]:
    """The fake SLURM on PATH; jobs find ``fake_slurm.jobs`` through PYTHONPATH. Its processes end with the test."""
    cluster = FakeSlurm(tmp_path / "slurm")
    for name, value in cluster.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FAKE_SLURM_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("FAKE_SLURM_HOLD", raising=False)
    yield cluster
    cluster.kill_all()


@pytest.fixture
def held(fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The fake SLURM with every job held in its queue: nothing runs."""
    monkeypatch.setenv("FAKE_SLURM_HOLD", "1")
    return fake


@pytest.fixture
def local_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For submitit's local executor: jobs import ``fake_slurm.jobs`` through PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    return tmp_path


TIMINGS = dict(timeout_min=10, poll_interval_s=0.2, result_wait_s=1.0, lost_after_s=60.0, signal_delay_s=30)


def settings(**changes) -> SlurmSettings:
    """Settings with test timings: sacct every 0.2 s, a result waited on for 1 s, a job lost after 60 s."""
    return SlurmSettings(**{**TIMINGS, **changes})


def spec(label: str, folder: Path, **overrides) -> RunSpec:
    traces = folder / "traces"
    traces.mkdir(exist_ok=True)
    return RunSpec(label=label, norm="rmsnorm", steps=5, seed=len(label), overrides={"dir": str(traces), **overrides})


def drain(launcher: SubmititLauncher, labels: set[str], timeout: float = 400.0) -> dict[str, list[RunEvent]]:
    """Every event until each of ``labels`` is final: label -> its events in order."""
    events: dict[str, list[RunEvent]] = {}
    deadline = time.monotonic() + timeout
    while any(not events.get(label) or events[label][-1].state not in FINAL for label in labels):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"runs not final after {timeout} s: { {k: [e.state for e in v] for k, v in events.items()} }"
            )
        for event in launcher.poll(5.0):
            events.setdefault(event.spec.label, []).append(event)
    return events


def records(folder: Path) -> list[tuple[str, str, str, int]]:
    return [(r.event, r.label, r.job_id, r.attempt) for r in JobRecords(folder).read()]


def wait_until(condition: Callable[[], bool], timeout: float = 240.0, what: str = "condition", every=None) -> None:
    """Waits for ``condition``, calling ``every`` (e.g. a launcher's poll) or sleeping in between."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met after {timeout} s")
        every() if every else time.sleep(0.1)


def fresh(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ----------------------------------------------------------------------------- settings
def test_settings_name_every_bad_field_at_once() -> None:
    with pytest.raises(ValueError, match="invalid cluster settings") as error:
        SlurmSettings(timeout_min=0, cpus_per_task=0, retries=-1, lost_after_s=0, mem_gb=-2)
    message = str(error.value)
    for part in ("timeout_min must be an integer >= 1, got 0",
                 "cpus_per_task", "retries", "lost_after_s", "mem_gb"):  # fmt: skip
        assert part in message
    with pytest.raises(ValueError, match=r"signal_delay_s \(120\) must be shorter than the time limit"):
        SlurmSettings(timeout_min=2, signal_delay_s=120)
    with pytest.raises(TypeError, match="setup must be a list of shell lines, got the string"):
        SlurmSettings(setup="module load cuda")


def test_a_study_name_that_is_no_job_name_is_refused(tmp_path: Path, held: FakeSlurm) -> None:
    with pytest.raises(UsageError, match="study name 'my study' is not a job name"):
        SlurmLauncher(settings(), tmp_path / "study", "my study", quick_run)


def test_slurm_without_srun_on_path_names_the_local_alternative(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="cluster 'local' runs here"):
        SlurmLauncher(settings(), tmp_path / "study", "study", quick_run)


# ----------------------------------------------------------------------------- the driver
def test_one_driver_per_study_folder(tmp_path: Path, held: FakeSlurm) -> None:
    first = SlurmLauncher(settings(), tmp_path / "study", "study", quick_run)
    with pytest.raises(UsageError, match=rf"another study driver \(pid {os.getpid()} on .*\) is using"):
        SlurmLauncher(settings(), tmp_path / "study", "study", quick_run)
    first.close()
    SlurmLauncher(settings(), tmp_path / "study", "study", quick_run).close()  # free again


# ----------------------------------------------------------------------------- submission, SLURM path
def test_the_sbatch_script_holds_the_requested_resources(tmp_path: Path, held: FakeSlurm) -> None:
    chosen = settings(
        partition="gpu",
        account="proj42",
        qos="high",
        timeout_min=90,
        gpus_per_node=1,
        cpus_per_task=4,
        mem_gb=16,
        additional_parameters={"constraint": "a100", "mail-type": "FAIL"},
        setup=["module load cuda/12.4", "export NCCL_DEBUG=WARN"],
        max_concurrent=2,
        signal_delay_s=120,
    )
    specs = [spec(f"run{i}", tmp_path) for i in range(3)]
    with SlurmLauncher(chosen, tmp_path / "study", "depth", quick_run) as launcher:
        assert isinstance(launcher, Launcher)
        launcher.start(specs)
        (call,) = held.log("sbatch")
        script = Path(call["script"]).read_text().splitlines()
        for line in ("--partition=gpu", "--account=proj42", "--qos=high", "--time=90", "--gpus-per-node=1",
                     "--cpus-per-task=4", "--mem=16GB", "--constraint=a100", "--mail-type=FAIL", "--array=0-2%2",
                     "--job-name=depth", "--signal=USR2@120", "--nodes=1", "--ntasks-per-node=1"):  # fmt: skip
            assert f"#SBATCH {line}" in script, line
        srun = next(i for i, line in enumerate(script) if line.startswith("srun "))
        assert script.index("module load cuda/12.4") < srun and script.index("export NCCL_DEBUG=WARN") < srun
        # recorded before start returned: label, job id, try, spec
        assert records(tmp_path / "study") == [("submitted", f"run{i}", f"1000_{i}", 1) for i in range(3)]
        assert JobRecords(tmp_path / "study").read()[0].spec["label"] == "run0"
        assert [(e.spec.label, e.state) for e in launcher.poll(0)] == [(f"run{i}", RunState.QUEUED) for i in range(3)]
        assert sorted(launcher.cancel()) == ["1000_0", "1000_1", "1000_2"]
        assert held.log("scancel") == [{"ids": [f"1000_{i}"], "signal": None} for i in range(3)]
        assert {e.state for e in launcher.poll(0)} == {RunState.FAILED}
        launcher.start(specs[:1])  # started again: reported again, not submitted again
        assert [(e.spec.label, e.state) for e in launcher.poll(0)] == [("run0", RunState.FAILED)]
        assert len(held.log("sbatch")) == 1
    assert {t["state"] for t in held.tasks().values()} == {"CANCELLED"}


def test_job_states_come_from_sacct_first_word_and_map_to_phases(tmp_path: Path, held: FakeSlurm) -> None:
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec(x, tmp_path) for x in "ab"])
        jobs = [launcher._job("1000_0"), launcher._job("1000_1"), launcher._job("999")]
        assert isinstance(jobs[0], submitit.SlurmJob)
        assert launcher._job_states(jobs) == {"1000_0": "PENDING", "1000_1": "PENDING"}  # 999: no entry
        held.end("1000_1", "CANCELLED")
        states = launcher._job_states(jobs)
        assert states == {"1000_0": "PENDING", "1000_1": "CANCELLED"}
        phases = [launcher._phase(states.get(job.job_id, "")) for job in jobs]
        assert phases == [JobPhase.QUEUED, JobPhase.ENDED, JobPhase.MISSING]
        assert launcher._batch(2, 5) == (5, 2) and launcher.executor._executor.parameters["array_parallelism"] == 2


def test_sacct_that_does_not_answer_leaves_the_states_unknown(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct
    assert sacct_states(["1000_0"]) is None


def test_max_concurrent_caps_the_study_across_arrays(tmp_path: Path, held: FakeSlurm) -> None:
    """SLURM throttles within one array (%N); a second array waits until the first leaves room under the cap."""
    with SlurmLauncher(settings(max_concurrent=2, retries=0), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec(x, tmp_path) for x in "abc"])
        launcher.start([spec("d", tmp_path)])
        assert [c["options"]["array"] for c in held.log("sbatch")] == ["0-2%2"]  # d is held by the launcher
        held.end("1000_0")
        drain(launcher, {"a"})
        assert len(held.log("sbatch")) == 1  # b and c still fill both slots
        held.end("1000_1")
        drain(launcher, {"b"})
        calls = held.log("sbatch")
        assert len(calls) == 2 and "array" not in calls[1]["options"]  # d alone: a plain job beside c
        assert records(tmp_path / "study")[-1] == ("submitted", "d", "1004", 1)


def test_a_job_lost_without_accounting_is_cancelled_and_resubmitted(tmp_path: Path, held: FakeSlurm) -> None:
    with SlurmLauncher(settings(lost_after_s=1.5), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec("a", tmp_path)])
        launcher.poll(3.0)
        launcher.poll(3.0)  # pending in sacct for 3 s: waited for, not lost
        assert records(tmp_path / "study") == [("submitted", "a", "1000", 1)]
        held.forget("1000")
        started = time.monotonic()
        wait_until(lambda: len(held.log("sbatch")) == 2, what="resubmission", every=lambda: launcher.poll(0.5))
        assert time.monotonic() - started >= 1.5  # not before lost_after_s: a lower bound holds on any machine
        assert held.log("scancel") == [{"ids": ["1000"], "signal": None}]  # so it cannot come back beside its retry
        assert records(tmp_path / "study") == [
            ("submitted", "a", "1000", 1),
            ("failed", "a", "1000", 1),
            ("submitted", "a", "1002", 2),
        ]
        assert "lost: no accounting entry and no result for 1.5 s" in JobRecords(tmp_path / "study").read()[1].error


def test_a_driver_killed_before_recording_its_job_adopts_it_on_restart(tmp_path: Path, held: FakeSlurm) -> None:
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec("a", tmp_path), spec("b", tmp_path)])
    (tmp_path / "study" / "jobs.jsonl").unlink()  # as if sbatch had answered and the driver died at once
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec("a", tmp_path), spec("b", tmp_path)])
        assert len(held.log("sbatch")) == 1
        assert records(tmp_path / "study") == [("submitted", "a", "1000_0", 1), ("submitted", "b", "1000_1", 1)]


def test_a_changed_spec_with_its_old_job_still_queued_is_refused(tmp_path: Path, held: FakeSlurm) -> None:
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([spec("a", tmp_path)])
    changed = replace(spec("a", tmp_path), lr=0.01)
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        with pytest.raises(UsageError, match=r"run 'a' has job\(s\) 1000 .* with other settings, still queued"):
            launcher.start([changed])
    held.end("1000", "CANCELLED")
    with SlurmLauncher(settings(), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([changed])  # the old run is over: the new one starts at try 1
        assert records(tmp_path / "study")[-1] == ("submitted", "a", "1002", 1)


# ----------------------------------------------------------------------------- inside a job
@pytest.fixture
def torch_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _preempted_at(step: int, check: bool, steps_run: list[int]) -> Callable[[RunSpec], int]:
    """A run of 0.02-s steps (at most 60 s) that signals itself (submitit's USR2) at ``step``; with ``check`` it stops
    at that step's end. ``steps_run`` gets each step as it starts."""

    def run(spec: RunSpec) -> int:
        for i in range(3000):
            steps_run.append(i)
            if i == step:
                os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.02)
            if check and preemption_requested():
                raise RunPreempted
        return torch.get_num_threads()

    return run


@pytest.mark.parametrize("check", [True, False], ids=["stops-at-step-end", "does-not-check"])
def test_the_preemption_signal_waits_for_the_run_then_hands_over_to_submitit(check: bool, torch_threads) -> None:
    """submitit's handler (here a stand-in that records where the run was) runs once: right after the run's
    step when the run checks ``preemption_requested``, else after the grace period, wherever the run is."""
    calls, steps_run = [], []

    def submitit_handler(signum, frame) -> None:
        calls.append(("handler", frame is None, steps_run[-1]))
        raise SystemExit(-1)  # submitit requeues and exits

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        job = CheckpointableRun(_preempted_at(5, check, steps_run), cpus_per_task=3, grace_s=1.0)
        started = time.monotonic()
        with pytest.raises(SystemExit):
            job(RunSpec(label="a", norm="rmsnorm"))
        elapsed = time.monotonic() - started
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert torch.get_num_threads() == 3
    # frame None: called by CheckpointableRun after RunPreempted, at the end of the signalled step; a frame: the
    # escalated signal, mid-run, not before the grace period (a lower bound, which holds on any machine)
    assert calls == [("handler", check, steps_run[-1])]
    assert steps_run[-1] == 5 if check else elapsed >= 1.0
    assert not preemption_requested()  # the request ends with the run
    assert signal.getsignal(signal.SIGUSR2) is previous


def test_outside_a_job_the_run_keeps_the_signal_alone(torch_threads, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert SlurmRun(lambda spec: torch.get_num_threads(), cpus_per_task=5)(RunSpec("a", "rmsnorm")) == 2
    # a local job inside a SLURM allocation inherits its variables: its threads follow the settings
    assert CheckpointableRun(lambda spec: torch.get_num_threads(), cpus_per_task=5)(RunSpec("a", "rmsnorm")) == 5
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

    def interrupted(spec: RunSpec) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # outside a job a Ctrl-C stays a Ctrl-C
        CheckpointableRun(interrupted)(RunSpec("a", "rmsnorm"))


@pytest.fixture
def submitit_signals() -> Iterator[list[tuple[str, bool]]]:
    """Stand-ins for the handlers submitit's job sets (``JobEnvironment._handle_signals``): USR2 checkpoints, requeues
    and exits (recorded, then ``SystemExit(-1)``); SIGTERM is logged and bypassed (recorded). Restored after."""
    calls: list[tuple[str, bool]] = []

    def requeue(signum, frame) -> None:
        calls.append(("requeue", frame is None))
        raise SystemExit(-1)

    def bypass(signum, frame) -> None:
        calls.append(("bypass", frame is None))

    previous = {
        sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGUSR2, requeue), (signal.SIGTERM, bypass))
    }
    try:
        yield calls
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signalled_at(step: int, *signals: signal.Signals) -> tuple[Callable[[RunSpec], None], list[int]]:
    """A run of 200 steps that sends itself ``signals`` at ``step`` and stops (``RunPreempted``) at the end of the first
    step that sees ``preemption_requested``; the list gets that step."""
    stopped: list[int] = []

    def run(spec: RunSpec) -> None:
        for i in range(200):
            if i == step:
                for sig in signals:
                    os.kill(os.getpid(), sig)
            if preemption_requested():
                stopped.append(i)
                raise RunPreempted
        raise AssertionError("the run was not asked to stop")

    return run, stopped


def test_sigterm_in_a_job_saves_at_the_step_end_then_exits_without_requeueing(submitit_signals, torch_threads) -> None:
    """SLURM's SIGTERM (preemption without send_user_signal; scancel) stops the run at its step's end, as USR2 does;
    the job then exits with 143 and does not requeue itself (a cancelled job must stay cancelled)."""
    run, stopped = _signalled_at(5, signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        CheckpointableRun(run, grace_s=600.0)(RunSpec(label="a", norm="rmsnorm"))
    assert exit_info.value.code == 128 + signal.SIGTERM == TERMINATED_EXIT_CODE
    assert stopped == [5] and submitit_signals == []  # at the step's end; neither of submitit's handlers ran
    assert not preemption_requested()
    assert signal.getsignal(signal.SIGTERM).__name__ == "bypass"  # submitit's handler is back


def test_sigterm_with_the_preemption_signal_requeues(submitit_signals, torch_threads) -> None:
    run, stopped = _signalled_at(5, signal.SIGTERM, signal.SIGUSR2)
    with pytest.raises(SystemExit) as exit_info:
        CheckpointableRun(run, grace_s=600.0)(RunSpec(label="a", norm="rmsnorm"))
    assert exit_info.value.code == -1 and stopped == [5]
    assert submitit_signals == [("requeue", True)]  # once, after the run stopped (no frame: not from a signal)


def test_a_run_stopped_by_sigterm_without_saving_exits_the_same_way(submitit_signals, torch_threads) -> None:
    """Lightning turns SIGTERM outside a step end into its own SystemExit (a KeyboardInterrupt once the run has
    seen it): the job exits as for SIGTERM, not as a failed run."""

    def run(spec: RunSpec) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        CheckpointableRun(run, grace_s=600.0)(RunSpec(label="a", norm="rmsnorm"))
    assert exit_info.value.code == TERMINATED_EXIT_CODE and submitit_signals == []


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit(3)], ids=["KeyboardInterrupt", "SystemExit"])
def test_a_run_ending_with_a_base_exception_in_a_job_is_a_recorded_error(submitit_signals, stop) -> None:
    """submitit records only an ``Exception`` as the job's error: the run's ``KeyboardInterrupt`` (the local
    controller's SIGINT) or ``SystemExit`` is raised again as one naming it, so the driver's reason is the cause."""

    def run(spec: RunSpec) -> None:
        raise stop

    with pytest.raises(RuntimeError, match=r"^the run ended with (KeyboardInterrupt|SystemExit: 3)$") as error:
        CheckpointableRun(run)(RunSpec(label="a", norm="rmsnorm"))
    assert isinstance(error.value.__cause__, (KeyboardInterrupt, SystemExit)) and submitit_signals == []


# ----------------------------------------------------------------------------- real jobs, fake SLURM
@pytest.mark.slow
def test_failed_tries_are_resubmitted_until_the_retries_are_spent(tmp_path: Path, fake: FakeSlurm) -> None:
    """A job killed mid-run, a run whose result says ``error`` and a run that ends with ``KeyboardInterrupt`` get a
    second try that succeeds; a run that raises every time is reported FAILED after its two tries, naming both
    errors. Each failed try's reason is the run's exception, not the last line of its log (a warning there)."""
    gate = tmp_path / "gate"
    killed, erred = spec("killed", tmp_path, gate=str(gate)), spec("erred", tmp_path, error_tries=1)
    broken = spec("broken", tmp_path, fail_tries=9)
    interrupted = spec("interrupted", tmp_path, interrupt_tries=1)
    with SlurmLauncher(settings(retries=1, cpus_per_task=3), tmp_path / "study", "s", quick_run) as launcher:
        launcher.start([killed, erred, broken, interrupted])
        fake.wait_for("1000_0", "RUNNING")
        wait_until(lambda: (tmp_path / "traces" / "killed.calls").exists(), what="the run started")
        fake.kill("1000_0")
        gate.touch()
        events = drain(launcher, {"killed", "erred", "broken", "interrupted"})
    for label in ("killed", "erred", "interrupted"):
        assert events[label][-1].state == RunState.DONE
        result = events[label][-1].result
        assert (
            result.status == "ok" and result.stability["calls"] == 2 and result.train_loss == expected_loss(result.spec)
        )
        assert result.stability["threads"] == 3  # the job's CPUs per task
    assert events["broken"][-1].state == RunState.FAILED and events["broken"][-1].result is None
    error = events["broken"][-1].error
    assert error.startswith("failed all 2 tries: try 1 (job 1000_2): RuntimeError: broken fails on purpose (call 1)")
    assert "try 2 (job " in error and "(call 2)" in error
    tries = {}
    for event, label, _, attempt in records(tmp_path / "study"):
        tries.setdefault(label, []).append(f"{event} {attempt}")
    assert (
        tries["killed"]
        == tries["erred"]
        == tries["interrupted"]
        == ["submitted 1", "failed 1", "submitted 2", "done 2"]
    )
    assert tries["broken"] == ["submitted 1", "failed 1", "submitted 2", "failed 2"]
    failed = {r.label: r.error for r in JobRecords(tmp_path / "study").read() if r.event == "failed" and r.attempt == 1}
    assert failed["killed"].startswith("the job ended (FAILED) without a result")
    assert failed["erred"] == "the run ended with status error: ValueError: the run recorded an error"
    assert failed["interrupted"].startswith("RuntimeError: the run ended with KeyboardInterrupt (log: ")
    log = Path(failed["interrupted"].split("(log: ")[1].rstrip(")")).read_text().splitlines()
    assert "LeafSpec" in log[-1]  # what the reason used to quote


@pytest.mark.slow
def test_a_restarted_driver_submits_nothing_queued_running_or_done(tmp_path: Path, fake: FakeSlurm) -> None:
    gate = tmp_path / "gate"
    specs = [spec("done", tmp_path), spec("running", tmp_path, gate=str(gate)), spec("queued", tmp_path)]
    with SlurmLauncher(settings(max_concurrent=1), tmp_path / "study", "s", quick_run) as first:
        first.start(specs)
        assert drain(first, {"done"})["done"][-1].state == RunState.DONE
        fake.wait_for("1000_1", "RUNNING")
    # the first driver is gone; its jobs are not
    with SlurmLauncher(settings(max_concurrent=1), tmp_path / "study", "s", quick_run) as second:
        second.start(specs)
        assert len(fake.log("sbatch")) == 1
        states = {}
        for event in second.poll(10.0):
            states[event.spec.label] = event.state
        assert states == {"done": RunState.DONE, "running": RunState.RUNNING, "queued": RunState.QUEUED}
        gate.touch()
        events = drain(second, {"running", "queued"})
    assert all(events[label][-1].state == RunState.DONE for label in ("running", "queued"))
    assert len(fake.log("sbatch")) == 1
    assert [r for r in records(tmp_path / "study") if r[0] == "submitted"] == [
        ("submitted", label, f"1000_{i}", 1) for i, label in enumerate(["done", "running", "queued"])
    ]
    assert [r[1] for r in records(tmp_path / "study") if r[0] == "done"] == ["done", "running", "queued"]


@pytest.mark.slow
def test_a_preempted_slurm_job_is_requeued_and_resumes_where_it_stopped(tmp_path: Path, fake: FakeSlurm) -> None:
    """``scancel --signal USR2`` (what SLURM does before the time limit): the run stops at a step end, submitit
    calls ``scontrol requeue``, and the same job runs again from the saved step, to the uninterrupted result."""
    run = replace(spec("stepped", tmp_path, hold_at_step=3), steps=30)  # its first start waits at step 3
    progress = tmp_path / "traces" / "stepped.progress.json"
    with SlurmLauncher(settings(), tmp_path / "study", "s", stepped_run) as launcher:
        launcher.start([run])
        wait_until(lambda: progress.exists() and json.loads(progress.read_text())["step"] == 3, what="step 3")
        assert os.system("scancel 1000 --signal USR2") == 0
        events = drain(launcher, {"stepped"})
    result = events["stepped"][-1].result
    assert result.train_loss == stepped_loss(run) and result.steps_done == 30  # the uninterrupted run's loss
    starts = result.stability["starts"]
    assert starts == [0, 3]  # stopped at the end of the step it was at
    assert fake.log("scontrol") == [{"args": ["requeue", "1000"]}]
    assert fake.tasks()["1000"]["restarts"] == 1 and len(fake.log("sbatch")) == 1
    assert records(tmp_path / "study") == [("submitted", "stepped", "1000", 1), ("done", "stepped", "1000", 1)]


@pytest.mark.slow
def test_a_sigterm_preempted_slurm_job_saves_and_its_next_try_resumes_where_it_stopped(
    tmp_path: Path, fake: FakeSlurm
) -> None:
    """SIGTERM alone (SLURM's preemption without ``PreemptParameters=send_user_signal``): the run stops at a step's
    end and the job exits without requeueing itself; the launcher's next try resumes from the saved step, to the
    uninterrupted result (submitit alone would bypass SIGTERM and lose every step at the SIGKILL)."""
    run = replace(spec("stepped", tmp_path, hold_at_step=3), steps=30)
    progress = tmp_path / "traces" / "stepped.progress.json"
    with SlurmLauncher(settings(retries=1), tmp_path / "study", "s", stepped_run) as launcher:
        launcher.start([run])
        wait_until(lambda: progress.exists() and json.loads(progress.read_text())["step"] == 3, what="step 3")
        assert os.system("scancel 1000 --signal TERM") == 0
        events = drain(launcher, {"stepped"})
    result = events["stepped"][-1].result
    assert result.train_loss == stepped_loss(run) and result.steps_done == 30  # the uninterrupted run's loss
    starts = result.stability["starts"]
    assert starts == [0, 3]  # stopped at the end of the step it was held at
    assert fake.log("scontrol") == []  # the job did not requeue itself
    assert [r[:2] + (r[3],) for r in records(tmp_path / "study")] == [
        ("submitted", "stepped", 1),
        ("failed", "stepped", 1),
        ("submitted", "stepped", 2),
        ("done", "stepped", 2),
    ]


# ----------------------------------------------------------------------------- real jobs, submitit's local executor
@pytest.mark.slow
def test_the_local_executor_runs_each_run_as_a_job_throttled(local_jobs: Path) -> None:
    """Two runs with ``max_concurrent=1`` (submitit's local executor starts every job of an array at once), the
    driver replaced while the first runs: one job at a time, the first re-attached (not run twice), each with
    torch's threads at the CPUs per task, with the results of the run function called directly."""
    tmp_path, gate = local_jobs, local_jobs / "gate"
    specs = [spec("first", tmp_path, gate=str(gate)), spec("second", tmp_path)]
    chosen = LocalSettings(**TIMINGS | dict(max_concurrent=1, timeout_min=10, cpus_per_task=3))
    with LocalJobLauncher(chosen, tmp_path / "study", "s", quick_run) as first:
        first.start(specs)
        wait_until(lambda: (tmp_path / "traces" / "first.calls").exists(), what="the first run started")
        assert [r[1] for r in records(tmp_path / "study")] == ["first"]  # the second waits for a free slot
    with LocalJobLauncher(chosen, tmp_path / "study", "s", quick_run) as second:
        try:
            second.start(specs)
            states = {e.spec.label: e.state for e in second.poll(10.0)}
            assert states == {"first": RunState.RUNNING, "second": RunState.QUEUED}
            gate.touch()
            events = drain(second, {"first", "second"})
        finally:
            second.cancel()
    results = [events[s.label][-1].result for s in specs]
    assert [r.status for r in results] == ["ok", "ok"] and [r.stability["threads"] for r in results] == [3, 3]
    assert [r.stability["calls"] for r in results] == [1, 1]
    assert results[0].stability["ended"] <= results[1].stability["started"]  # one after the other
    direct = [quick_run(replace(s, overrides={"dir": str(fresh(tmp_path / "direct"))})) for s in specs]
    assert [(r.status, r.steps_done, r.train_loss) for r in results] == [
        (r.status, r.steps_done, r.train_loss) for r in direct
    ]
    jobs = [r[2] for r in records(tmp_path / "study") if r[0] == "submitted"]
    assert len(jobs) == 2 and all(job.isdigit() for job in jobs)  # local jobs are processes
    assert [p for p in (tmp_path / "study").rglob("*") if "%" in p.name] == []  # no literal jobs/%j folder


@pytest.mark.slow
def test_a_preempted_local_job_resumes_from_its_checkpoint_with_the_same_result(local_jobs: Path) -> None:
    """As submitit's own tests interrupt a local job: USR2 to the job's process. submitit's controller
    restarts the requeued task in the same job; the run resumes from its saved step."""
    tmp_path = local_jobs
    run = replace(spec("stepped", tmp_path, hold_at_step=3), steps=30)  # its first start waits at step 3
    progress = tmp_path / "traces" / "stepped.progress.json"
    chosen = LocalSettings(**TIMINGS | dict(timeout_min=10))
    with LocalJobLauncher(chosen, tmp_path / "study", "s", stepped_run) as launcher:
        try:
            launcher.start([run])
            wait_until(lambda: progress.exists() and json.loads(progress.read_text())["step"] == 3, what="step 3")
            (job,) = [r[2] for r in records(tmp_path / "study")]
            (task,) = psutil.Process(int(job)).children()  # submitit's controller runs the task
            task.send_signal(signal.SIGUSR2)
            events = drain(launcher, {"stepped"})
        finally:
            launcher.cancel()
    assert [e.state for e in events["stepped"]][-1] == RunState.DONE
    result = events["stepped"][-1].result
    assert result.train_loss == stepped_loss(run) and result.steps_done == 30  # the uninterrupted run's loss
    starts = result.stability["starts"]
    assert starts == [0, 3]  # stopped at the end of the step it was at
    assert records(tmp_path / "study") == [("submitted", "stepped", job, 1), ("done", "stepped", job, 1)]
    assert [p for p in (tmp_path / "study").rglob("*") if "%" in p.name] == []  # not after the restart either

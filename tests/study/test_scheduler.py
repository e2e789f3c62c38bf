"""The scheduler drives any launcher (``bhyt_pl.study.launch.launcher.Launcher``): a scripted one that batches its
starts
and reports runs out of order, running before done, failed without a result, and a run it was never given."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bhyt_pl.study.launch.launcher import RunEvent, RunState
from bhyt_pl.study.launch.scheduler import Scheduler, finished_result, progress_line
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, run_dirname


class ScriptedLauncher:
    """A cluster-like launcher: ``start`` records one batch (a job array); each ``poll`` returns the next scripted
    list of events, built from the runs started so far."""

    def __init__(self, script: Sequence) -> None:
        self.script = list(script)
        self.batches: list[list[str]] = []
        self.started: dict[str, RunSpec] = {}
        self.closed = False

    def start(self, specs: Sequence[RunSpec]) -> None:
        self.batches.append([s.label for s in specs])
        self.started.update({s.label: s for s in specs})

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        return self.script.pop(0)(self.started) if self.script else []

    def close(self) -> None:
        self.closed = True


def done(label: str, loss: float):
    return lambda started: [RunEvent(started[label], RunState.DONE, result=RunResult(started[label], val_loss=loss))]


def _specs(*labels: str) -> list[RunSpec]:
    return [RunSpec(label=label, norm="rmsnorm") for label in labels]


def test_results_follow_the_launchers_reports_whatever_their_order(tmp_path: Path) -> None:
    script = [
        lambda s: [RunEvent(s["a"], RunState.RUNNING), RunEvent(s["b"], RunState.RUNNING)],  # no result yet
        done("b", 2.0),
        lambda s: [
            RunEvent(s["a"], RunState.FAILED, error="job 17 was cancelled"),
            RunEvent(RunSpec(label="stranger", norm="rmsnorm"), RunState.DONE),  # not this study's: ignored
        ],
        done("c", 3.0),
    ]
    launcher = ScriptedLauncher(script)
    scheduler = Scheduler(launcher, tmp_path, resume=True)
    assert [s.label for s in scheduler.submit(_specs("a", "b"))] == ["a", "b"]
    results = []
    for result in scheduler.finished():
        results.append(result)
        if result.spec.label == "b":  # the protocol submits more while iterating; a repeated label is dropped
            assert [s.label for s in scheduler.submit(_specs("b", "c"))] == ["c"]
    assert launcher.batches == [["a", "b"], ["c"]]  # one start per submit: the launcher may batch it
    assert [(r.spec.label, r.status) for r in results] == [("b", "ok"), ("a", "error"), ("c", "ok")]
    assert results[1].error == "job 17 was cancelled" and results[2].val_loss == 3.0
    assert scheduler.states == {"a": RunState.FAILED, "b": RunState.DONE, "c": RunState.DONE}
    assert scheduler.submitted == 3 and scheduler.pending == {}


def test_finished_runs_are_read_back_and_not_started(tmp_path: Path) -> None:
    spec, other = _specs("kept", "new")
    stored = RunResult(spec, val_loss=1.5)
    path = tmp_path / "runs" / run_dirname(spec.label) / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(stored.to_dict(), default=str))
    assert finished_result(tmp_path, spec).val_loss == 1.5
    launcher = ScriptedLauncher([done("new", 2.0)])
    scheduler = Scheduler(launcher, tmp_path, resume=True)
    scheduler.submit([spec, other])
    assert [(r.spec.label, r.val_loss) for r in scheduler.finished()] == [("kept", 1.5), ("new", 2.0)]
    assert launcher.batches == [["new"]] and scheduler.reused == ["kept"]
    restart = ScriptedLauncher([done("kept", 9.0)])
    again = Scheduler(restart, tmp_path, resume=False)  # --restart: trained again
    again.submit([spec])
    assert [r.val_loss for r in again.finished()] == [9.0] and again.reused == []


def test_a_launcher_that_reports_nothing_for_pending_runs_is_an_error(tmp_path: Path) -> None:
    scheduler = Scheduler(ScriptedLauncher([]), tmp_path, resume=False)
    scheduler.submit(_specs("lost"))
    with pytest.raises(RuntimeError, match=r"reported no change while 1 run\(s\) are pending \(lost"):
        list(scheduler.finished())


def test_done_without_a_result_is_a_failed_run(tmp_path: Path) -> None:
    launcher = ScriptedLauncher([lambda s: [RunEvent(s["a"], RunState.DONE)]])
    scheduler = Scheduler(launcher, tmp_path, resume=False)
    scheduler.submit(_specs("a"))
    (result,) = scheduler.finished()
    assert result.status == "error" and "without a result" in result.error


def test_the_scheduler_takes_launchers_only(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with pytest.raises(TypeError, match="launcher must implement start, poll and close"):
        Scheduler(ThreadPoolExecutor(1), tmp_path, resume=False)


def test_progress_line_says_run_k_of_n_and_the_time_left() -> None:
    """``study`` printed nothing between runs (a default study takes about 50 minutes)."""
    assert progress_line(3, 10, 60.0) == "study: run 3 of 10 done; about 2.3 min left"  # 20 s a run, 7 left
    assert progress_line(3, 10, 60.0, reused=1) == "study: run 3 of 10 done; about 3.5 min left"
    assert progress_line(9, 10, 18.0) == "study: run 9 of 10 done; about 2 s left"
    assert progress_line(10, 10, 100.0) == "study: run 10 of 10 done"
    assert progress_line(2, 10, 0.0, reused=2) == "study: run 2 of 10 done"  # no pace yet
    # while the protocol may still add runs (grid extensions, the matched arm) both figures are lower bounds
    line = progress_line(3, 10, 60.0, final=False)
    assert line == "study: run 3 of at least 10 done; about 2.3 min left (at least)"


def test_counts_follow_each_report_and_an_error_result_counts_as_failed(tmp_path: Path) -> None:
    """What a cluster's driver shows between results: queued, running, done (reused included) and failed."""

    def error_result(s):
        return [RunEvent(s["b"], RunState.DONE, result=RunResult(s["b"], status="error", error="CUDA out of memory"))]

    script = [
        lambda s: [RunEvent(s["a"], RunState.RUNNING)],
        lambda s: [RunEvent(s["b"], RunState.RUNNING), RunEvent(s["c"], RunState.FAILED, error="lost")],
        error_result,  # the job ended well, the run did not
        done("a", 1.0),
    ]
    reused = RunSpec(label="r", norm="rmsnorm")
    run_dir = tmp_path / "runs" / run_dirname("r")
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps(RunResult(reused, val_loss=0.5).to_dict()))
    seen: list[dict[str, int]] = []
    scheduler = Scheduler(ScriptedLauncher(script), tmp_path, resume=True, on_change=seen.append)
    scheduler.submit([reused, *_specs("a", "b", "c")])
    assert scheduler.counts() == {"queued": 3, "running": 0, "done": 1, "failed": 0}
    results = list(scheduler.finished())
    assert seen == [
        {"queued": 2, "running": 1, "done": 1, "failed": 0},
        {"queued": 0, "running": 2, "done": 1, "failed": 1},
        {"queued": 0, "running": 1, "done": 1, "failed": 2},
        {"queued": 0, "running": 0, "done": 2, "failed": 2},
    ]
    assert scheduler.failed == ["b", "c"] and [r.status for r in results] == ["ok", "error", "error", "ok"]
    line = progress_line(2, 4, 10.0, reused=1, counts=scheduler.counts())
    assert line.startswith("study: run 2 of 4 done (0 running, 0 queued, 2 failed)")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"status": "ok", "spec": {"label": "kept"', "cannot be read (JSONDecodeError"),  # a torn record
        ("[]", "cannot be read (AttributeError"),
        (None, "was made with other settings (lr, steps differ)"),
        ("error", "its last try ended with error"),
    ],
)
def test_a_record_that_is_not_reused_is_named_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str | None, why: str
) -> None:
    spec = RunSpec(label="kept", norm="rmsnorm", lr=1e-3, steps=10)
    path = tmp_path / "runs" / run_dirname(spec.label) / "result.json"
    path.parent.mkdir(parents=True)
    if content is None:
        old = RunSpec(label="kept", norm="rmsnorm", lr=3e-3, steps=20)
        content = json.dumps(RunResult(old, val_loss=1.5).to_dict(), default=str)
    elif content == "error":
        content = json.dumps(RunResult(spec, status="error", error="boom").to_dict(), default=str)
    path.write_text(content)
    with caplog.at_level("INFO", logger="bhyt_pl.study.launch.scheduler"):
        assert finished_result(tmp_path, spec) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("study run kept: trained again") and why in message
    caplog.clear()
    with caplog.at_level("INFO", logger="bhyt_pl.study.launch.scheduler"):
        assert finished_result(tmp_path, RunSpec(label="never", norm="rmsnorm")) is None
    assert not caplog.records  # no record at all: a new run, nothing to say

"""``InlineLauncher`` (``bhyt_pl.study.launch.inline``): the runs train in this process, one per ``poll``, in start
order; a run that raised is one failed run with the exception's text, and ``close`` drops what has not started."""

from __future__ import annotations

from bhyt_pl.study.launch.inline import InlineLauncher
from bhyt_pl.study.launch.launcher import Launcher, RunState
from bhyt_pl.study.protocol.spec import RunResult, RunSpec


def _run(spec: RunSpec) -> RunResult:
    if spec.norm == "boom":
        raise RuntimeError(f"no run for {spec.label}")
    return RunResult(spec, val_loss=spec.lr)


def test_inline_launcher_trains_one_run_per_poll_in_start_order() -> None:
    trained: list[str] = []
    launcher = InlineLauncher(lambda spec: trained.append(spec.label) or _run(spec))
    assert isinstance(launcher, Launcher)
    assert launcher.poll() == []  # nothing started: nothing changes
    specs = [RunSpec(label=f"r{i}", norm="rmsnorm", lr=float(i)) for i in range(3)]
    launcher.start(specs[:2])
    launcher.start([RunSpec(label="bad", norm="boom")])
    assert trained == []  # starting trains nothing yet
    first = launcher.poll()
    assert [(e.spec.label, e.state) for e in first] == [("r0", RunState.DONE)] and trained == ["r0"]
    assert first[0].result.val_loss == 0.0
    assert [(e.spec.label, e.state) for e in launcher.poll()] == [("r1", RunState.DONE)]
    (failed,) = launcher.poll()
    assert (failed.state, failed.error, failed.result) == (RunState.FAILED, "RuntimeError: no run for bad", None)
    launcher.start([specs[2]])
    launcher.close()  # queued runs are dropped
    assert launcher.poll() == [] and trained == ["r0", "r1", "bad"]

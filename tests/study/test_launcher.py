"""The launcher protocol (``bhyt_pl.study.launch.launcher``): what counts as a launcher, and what an event carries."""

from __future__ import annotations

from collections.abc import Sequence

from bhyt_pl.study.launch.launcher import Launcher, RunEvent, RunState
from bhyt_pl.study.protocol.spec import RunResult, RunSpec


class Minimal:
    def start(self, specs: Sequence[RunSpec]) -> None: ...

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        return []

    def close(self) -> None: ...


def test_anything_with_start_poll_and_close_is_a_launcher() -> None:
    assert isinstance(Minimal(), Launcher)
    assert not isinstance(object(), Launcher)


def test_events_carry_a_result_when_done_and_a_reason_when_failed() -> None:
    spec = RunSpec(label="a", norm="rmsnorm")
    done = RunEvent(spec, RunState.DONE, result=RunResult(spec))
    failed = RunEvent(spec, RunState.FAILED, error="job 3 was cancelled")
    assert done.result.spec is spec and done.error is None
    assert failed.result is None and failed.error == "job 3 was cancelled"
    assert [s.value for s in RunState] == ["queued", "running", "done", "failed"]

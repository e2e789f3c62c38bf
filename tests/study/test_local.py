"""The local launchers (``bhyt_pl.study.local``): both implement the launcher protocol, report a run that raised
as failed, and a small study trained through the process pool gives the inline launcher's results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bhyt_pl.study import main
from bhyt_pl.study.launcher import Launcher, RunState
from bhyt_pl.study.local import InlineLauncher, ProcessPoolLauncher
from bhyt_pl.study.runner import RunResult, RunSpec


def scripted_run(spec: RunSpec) -> RunResult:
    """A run whose validation loss is its learning rate, trained in whichever process calls it; ``boom`` raises."""
    if spec.norm == "boom":
        raise RuntimeError(f"no run for {spec.label}")
    return RunResult(spec, val_loss=spec.lr, tokens=os.getpid())


SPECS = [RunSpec(label=f"r{i}", norm="rmsnorm", lr=float(i)) for i in range(4)]


def _drain(launcher: Launcher, n: int) -> list:
    final: list = []
    while len(final) < n:
        final += [e for e in launcher.poll(timeout=None) if e.state in (RunState.DONE, RunState.FAILED)]
    return final


def test_inline_launcher_trains_one_run_per_poll_in_start_order() -> None:
    trained: list[str] = []
    launcher = InlineLauncher(lambda spec: trained.append(spec.label) or scripted_run(spec))
    assert isinstance(launcher, Launcher)
    assert launcher.poll() == []  # nothing started: nothing changes
    launcher.start(SPECS[:2])
    launcher.start([RunSpec(label="bad", norm="boom"), SPECS[2]])
    assert trained == []  # starting trains nothing yet
    first = launcher.poll()
    assert [(e.spec.label, e.state) for e in first] == [("r0", RunState.DONE)] and trained == ["r0"]
    assert first[0].result.val_loss == 0.0
    rest = _drain(launcher, 3)
    assert [(e.spec.label, e.state) for e in rest] == [
        ("r1", RunState.DONE),
        ("bad", RunState.FAILED),
        ("r2", RunState.DONE),
    ]
    assert rest[1].error == "RuntimeError: no run for bad" and rest[1].result is None
    launcher.start([SPECS[3]])
    launcher.close()  # queued runs are dropped
    assert launcher.poll() == []


@pytest.mark.slow
def test_process_pool_launcher_trains_in_workers_and_reports_failures() -> None:
    launcher = ProcessPoolLauncher(scripted_run, workers=2)
    try:
        assert isinstance(launcher, Launcher)
        launcher.start([*SPECS, RunSpec(label="bad", norm="boom")])
        events = _drain(launcher, 5)
    finally:
        launcher.close()
    by_label = {e.spec.label: e for e in events}
    assert sorted(by_label) == ["bad", "r0", "r1", "r2", "r3"]
    assert by_label["bad"].state is RunState.FAILED and by_label["bad"].error == "RuntimeError: no run for bad"
    assert [by_label[f"r{i}"].result.val_loss for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert {by_label[f"r{i}"].result.tokens for i in range(4)}.isdisjoint({os.getpid()})  # trained elsewhere
    with pytest.raises(ValueError, match="workers must be >= 1"):
        ProcessPoolLauncher(scripted_run, workers=0)


TINY = ["--quick", "--layers", "2", "--steps", "2", "--seq-len", "32", "--batch-size", "2", "--val-batches", "4"]
TINY += ["--shuffle-buffer", "4", "--no-compile", "--seeds", "1", "--lrs", "1e-3", "3e-3", "--trajectory-every", "1"]
TINY += ["--schemes", "rmsnorm", "bhyt"]


@pytest.mark.slow
def test_a_small_study_through_the_process_pool_matches_the_inline_launcher(tmp_path: Path) -> None:
    """Same runs, same numbers: each run is seeded by its spec alone, whichever process trains it (both with one
    torch thread, as the pool's workers have). The numbers agree to float32 rounding, not bit for bit: a CPU
    matrix product may round differently in another process (its buffers aligned differently)."""
    assert main([*TINY, "--workers", "1", "--threads", "1", "--out", str(tmp_path / "inline")]) == 0
    assert main([*TINY, "--workers", "2", "--out", str(tmp_path / "pool")]) == 0
    inline, pool = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("inline", "pool"))
    assert inline["design"] == pool["design"]
    assert [r["spec"] for r in inline["runs"]] == [r["spec"] for r in pool["runs"]] and len(inline["runs"]) == 8
    for a, b in zip(inline["runs"], pool["runs"], strict=True):
        assert a["status"] == b["status"] == "ok"
        assert [v for _, v in a["losses"]] == pytest.approx([v for _, v in b["losses"]], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
        for p, q in zip(a["trajectory"], b["trajectory"], strict=True):
            assert p["step"] == q["step"]
            assert p["magnitude"] + p["variance"] == pytest.approx(q["magnitude"] + q["variance"], rel=1e-4)
    verdicts = [[t["verdict"] for t in c["tests"]] for c in inline["claims"]]
    assert verdicts == [[t["verdict"] for t in c["tests"]] for c in pool["claims"]]

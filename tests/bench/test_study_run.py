"""``bench --parts study_run``: the interleaving, the ratios and the table, with the study run itself replaced by
a scripted one (the real runs take minutes; tests/study/test_runner.py trains both paths for real)."""

from __future__ import annotations

import contextlib
import io

import pytest

from bhyt_pl.bench import main, study_run
from bhyt_pl.bench.command import DEFAULT_PARTS, PARTS
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.run import runner


def test_study_run_table_interleaves_paths_and_divides_wall_times(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bool]] = []
    clock = [0.0]
    cost = {("rmsnorm", False): 10.0, ("rmsnorm", True): 6.0, ("bhyt", False): 12.0, ("bhyt", True): 9.0}

    def fake_run(spec, factory, batches, settings, out):
        calls.append((spec.norm, settings.compile))
        first = sum(1 for c in calls if c == (spec.norm, settings.compile)) == 1
        clock[0] += cost[spec.norm, settings.compile] + (5.0 if settings.compile and first else 0.0)  # compile
        result = RunResult(spec=spec, train_seconds=1.0, val_loss=5.0 + 1e-4 * settings.compile)
        result.losses = [(spec.steps, 6.0)]
        return result

    monkeypatch.setattr(runner, "run_one", fake_run)
    monkeypatch.setattr(study_run.time, "perf_counter", lambda: clock[0])
    table = study_run.study_run_table(["rmsnorm", "bhyt"], steps=3, repeats=3)
    # eager and compiled of one scheme back to back, the order alternating between repetitions
    assert calls[:4] == [("rmsnorm", False), ("rmsnorm", True), ("bhyt", False), ("bhyt", True)]
    assert calls[4:8] == [("rmsnorm", True), ("rmsnorm", False), ("bhyt", True), ("bhyt", False)]
    assert table["settings"]["steps"] == 3 and table["settings"]["preset"] == "deep-32x128"
    assert table["runs"]["rmsnorm"]["compiled"]["wall_s"] == [11.0, 6.0, 6.0]
    assert table["ratio"]["rmsnorm"]["first_run"] == pytest.approx(11.0 / 10.0)
    assert table["ratio"]["rmsnorm"]["later_runs_median"] == pytest.approx(0.6)
    assert table["ratio"]["bhyt"]["later_runs_median"] == pytest.approx(0.75)
    assert table["ratio"]["bhyt"]["val_loss_abs_diff"] == pytest.approx(1e-4)
    text = study_run.study_run_markdown(table)
    assert "| rmsnorm | 10.0 | 10.0 | 11.0 | 6.0 | 1.100 | 0.600 |" in text


def test_study_run_is_asked_for_not_a_default_part() -> None:
    assert "study_run" in PARTS and "study_run" not in DEFAULT_PARTS
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["--parts", "study_run", "--study-steps", "5", "--dry-run"]) == 0
    assert '"study_steps": 5' in buffer.getvalue()
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        study_run.study_run_table(["rmsnorm"], steps=1, repeats=0)

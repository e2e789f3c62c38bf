"""The wall-time account of a study folder's invocations (``bhyt_pl.study.record.invocation``): a resumed invocation
adds to the earlier ones, a record that died running is marked stopped, an older record counts as one invocation,
and ``--restart`` or an unreadable record starts afresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bhyt_pl.study.record.invocation import Invocation
from bhyt_pl.study.record.results import StudyRecord, save


def test_a_resumed_invocation_adds_its_wall_time_to_the_earlier_ones(tmp_path: Path) -> None:
    earlier = [
        {"started": "2025-01-02 10:00:00", "wall_seconds": 120.0, "outcome": "interrupted"},
        {"started": "2025-01-02 11:00:00", "wall_seconds": 30.5, "outcome": "running"},  # its driver was killed
    ]
    save(tmp_path, StudyRecord("exploration", {"wall_seconds": 150.5, "invocations": earlier}))
    invocation = Invocation.resume(tmp_path)
    assert [i["outcome"] for i in invocation.earlier] == ["interrupted", "stopped"]
    meta: dict = {}
    invocation.record(meta, done=3, planned=10, final=False)
    assert meta["partial"] == {"runs_done": 3, "runs_planned": 10, "planned_final": False, "state": "running"}
    this = meta["invocations"][-1]
    assert len(meta["invocations"]) == 3 and this["outcome"] == "running"
    assert meta["wall_seconds"] == pytest.approx(150.5 + this["wall_seconds"], abs=0.11)  # each rounded to 0.1 s
    invocation.record(meta, done=10, planned=10, outcome="finished")
    assert "partial" not in meta and meta["invocations"][-1]["outcome"] == "finished"


def test_an_older_record_counts_as_one_invocation_and_restart_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"wall_seconds": 36.7}, "runs": []}))  # schema 1
    assert Invocation.resume(tmp_path).earlier == [{"wall_seconds": 36.7}]
    assert Invocation.resume(tmp_path, restart=True).earlier == []  # --restart trains the study again
    assert Invocation.resume(tmp_path / "missing").earlier == []
    (tmp_path / "results.json").write_text("{torn")
    assert Invocation.resume(tmp_path).earlier == []  # unreadable: nothing carried over, with a log line

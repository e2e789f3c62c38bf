"""A study's record (``bhyt_pl.study.record.results``): written, read back into typed values, a design recorded before
it
carried its frame completed from ``meta``, a file that is not a study's record named, and the invocations of a
resumed study (total wall time, the partial marker until it finishes; an older record as one invocation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_fixtures import synthetic

from bhyt_pl.study.protocol.design import Selection, StudyDesign, StudyRuns, parse_group
from bhyt_pl.study.record.invocation import Invocation
from bhyt_pl.study.record.results import StudyRecord, load


def _record() -> StudyRecord:
    """Two groups of registered schemes, each kept at one rate, with two evaluation seeds."""
    runs, selections = [], {}
    for group, lr in (("rmsnorm", 1e-3), ("bhyt", 3e-3)):
        chosen = synthetic(group, lr, 0, [1.0, 2.0], 3.0)
        runs += [chosen, synthetic(group, lr, 1, [1.0, 2.0], 3.1), synthetic(group, lr, 2, [1.0, 3.0], 3.2)]
        selections[group] = Selection(group, chosen, (chosen,))
    groups = (parse_group("rmsnorm"), parse_group("bhyt"))
    design = StudyDesign(groups, (1e-3, 3e-3), 2, 1, selections, (3e-3,), "given with --matched-lrs")
    return StudyRecord(
        "exploration", {"command": "python -m bhyt_pl study", "schemes": ["rmsnorm", "bhyt"]}, runs, design=design
    )


def test_a_record_reads_back_from_its_file(tmp_path: Path) -> None:
    record = _record()
    document = record.to_dict(claims=[{"statement": "x"}], claims_not_tested=["y"])
    assert list(document) == ["meta", "design", "claims", "claims_not_tested", "runs"]
    (tmp_path / "results.json").write_text(json.dumps(document))
    back = load(tmp_path)  # the folder or the file
    assert back.meta == record.meta and back.design.to_dict() == record.design.to_dict() and not back.sweep
    assert back.design.groups == record.design.groups
    assert back.design.kept("bhyt").chosen.spec.label == "bhyt@lr0.003-s0"
    assert json.dumps([r.to_dict() for r in back.runs]) == json.dumps([r.to_dict() for r in record.runs])
    assert back.design.evaluation_runs(StudyRuns(back.runs), "bhyt")[1].spec.label == "bhyt@lr0.003-s2"
    sweep = StudyRecord("exploration", {"mode": "study-sweep"}, record.runs)
    assert list(sweep.to_dict()) == ["meta", "runs"] and StudyRecord.from_dict(sweep.to_dict()).sweep


def test_an_older_design_takes_its_frame_from_meta() -> None:
    record = _record()
    document = json.loads(json.dumps(record.to_dict()))
    for key in ("groups", "lrs", "seeds", "extensions"):
        del document["design"][key]
    document["meta"].update({"lrs": [1e-3, 3e-3], "seeds": 2, "extensions": 1})
    assert StudyRecord.from_dict(document).design.to_dict() == record.design.to_dict()
    document["meta"]["schemes"] = ["rmsnorm", "nonorm"]
    with pytest.raises(ValueError, match="unknown scheme 'nonorm'"):  # the groups are parsed again
        StudyRecord.from_dict(document)


def test_what_is_not_a_record_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the study's record"):
        load(tmp_path / "missing.json")
    (tmp_path / "results.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="results.json has no 'meta'"):
        load(tmp_path)


def test_a_confirmations_record_is_named_not_read_as_a_sweep(tmp_path: Path) -> None:
    """A confirmation's results.json has meta and runs too; read as a study's it would pass for a sweep."""
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"kind": "confirmation"}, "plan": {}, "runs": []}))
    with pytest.raises(ValueError, match="is a confirmation's record; rebuild its report with python -m bhyt_pl study"):
        load(tmp_path)


def test_a_resumed_invocation_adds_its_wall_time_to_the_earlier_ones(tmp_path: Path) -> None:
    earlier = [
        {"started": "2025-01-02 10:00:00", "wall_seconds": 120.0, "outcome": "interrupted"},
        {"started": "2025-01-02 11:00:00", "wall_seconds": 30.5, "outcome": "running"},  # its driver was killed
    ]
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"wall_seconds": 150.5, "invocations": earlier}}))
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
    (tmp_path / "results.json").write_text(json.dumps({"meta": {"wall_seconds": 36.7}, "runs": []}))
    assert Invocation.resume(tmp_path).earlier == [{"wall_seconds": 36.7}]
    assert Invocation.resume(tmp_path, restart=True).earlier == []  # --restart trains the study again
    assert Invocation.resume(tmp_path / "missing").earlier == []
    (tmp_path / "results.json").write_text("{torn")
    assert Invocation.resume(tmp_path).earlier == []  # unreadable: nothing carried over, with a log line

"""A study's record (``bhyt_pl.study.record.results``): written, read back into typed values, a design recorded before
it
carried its frame completed from ``meta``, a file that is not a study's record named, and the invocations of a
resumed study (total wall time, the partial marker until it finishes; an older record as one invocation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_fixtures import two_group_record

from bhyt_pl.study.protocol.design import StudyRuns
from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.record.results import StudyRecord, load, save
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.record.upgrade import SCHEMA_VERSION
from bhyt_pl.study.run.data import StudyData

DOCS = Path(__file__).resolve().parents[2] / "docs" / "depth_study"


def test_a_record_reads_back_from_its_file(tmp_path: Path) -> None:
    record = two_group_record()
    document = record.to_dict({"claims": [{"statement": "x"}], "claims_not_tested": ["y"]})
    assert list(document) == [
        "schema_version",
        "kind",
        "setup",
        "meta",
        "design",
        "claims",
        "claims_not_tested",
        "runs",
    ]
    assert document["schema_version"] == SCHEMA_VERSION and document["kind"] == "exploration"
    (tmp_path / "results.json").write_text(json.dumps(document))
    back = load(tmp_path)  # the folder or the file
    assert back.meta == record.meta and back.design.to_dict() == record.design.to_dict() and not back.sweep
    assert back.design.groups == record.design.groups
    assert back.design.kept("bhyt").chosen.spec.label == "bhyt@lr0.003-s0"
    assert json.dumps([r.to_dict() for r in back.runs]) == json.dumps([r.to_dict() for r in record.runs])
    assert back.design.evaluation_runs(StudyRuns(back.runs), "bhyt")[1].spec.label == "bhyt@lr0.003-s2"
    sweep = StudyRecord("exploration", {"mode": "study-sweep"}, record.runs)
    assert list(sweep.to_dict()) == ["schema_version", "kind", "setup", "meta", "runs"]
    assert StudyRecord.from_dict(sweep.to_dict()).sweep


def test_the_setup_round_trips_and_a_confirmation_trains_with_it(tmp_path: Path) -> None:
    setup = RecordedSetup(
        StudyData("embedded", "allenai/c4", "embedded", 32, 2, 0, 4), 4, TrainerSettings(), {"A": "a"}
    )
    record = StudyRecord("exploration", {}, [], setup)
    save(tmp_path, record)
    assert load(tmp_path).setup == setup


def test_what_is_not_a_record_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the study's record"):
        load(tmp_path / "missing.json")
    (tmp_path / "results.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match=r"results.json has no \['meta'\]"):
        load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"schema_version": 99, "meta": {}, "runs": []}))
    with pytest.raises(ValueError, match="schema_version 99 is newer than this version reads"):
        load(tmp_path)

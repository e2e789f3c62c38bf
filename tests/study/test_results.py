"""A study's record (``bhyt_pl.study.record.results``): written, read back into typed values, a design recorded before
it
carried its frame completed from ``meta``, a file that is not a study's record named, and the invocations of a
resumed study (total wall time, the partial marker until it finishes; an older record as one invocation)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from study_fixtures import synthetic

from bhyt_pl.study.protocol.design import Selection, StudyDesign, StudyRuns, parse_group
from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.record.invocation import Invocation
from bhyt_pl.study.record.results import StudyRecord, load, save
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.record.upgrade import SCHEMA_VERSION, V1_SETUP_SOURCE, upgrade
from bhyt_pl.study.run.data import StudyData

DOCS = Path(__file__).resolve().parents[2] / "docs" / "depth_study"


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


def test_a_schema_1_design_takes_its_frame_from_meta() -> None:
    record = _record()
    document = json.loads(json.dumps(record.to_dict()))
    for key in ("schema_version", "kind", "setup"):
        del document[key]
    for key in ("groups", "lrs", "seeds", "extensions"):
        del document["design"][key]
    document["meta"].update({"lrs": [1e-3, 3e-3], "seeds": 2, "extensions": 1})
    assert StudyRecord.from_dict(upgrade(document)).design.to_dict() == record.design.to_dict()
    document["meta"]["schemes"] = ["rmsnorm", "nonorm"]
    with pytest.raises(ValueError, match="unknown scheme 'nonorm'"):  # the groups are parsed again
        StudyRecord.from_dict(upgrade(document))


def test_what_is_not_a_record_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the study's record"):
        load(tmp_path / "missing.json")
    (tmp_path / "results.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match=r"results.json has no \['meta'\]"):
        load(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"schema_version": 99, "meta": {}, "runs": []}))
    with pytest.raises(ValueError, match="schema_version 99 is newer than this version reads"):
        load(tmp_path)


def test_the_committed_schema_1_records_load_through_the_converter(caplog: pytest.LogCaptureFixture) -> None:
    """docs/depth_study/results.json predates kind, schema_version and setup: the converter names its kind, and
    rebuilds its setup once from its recorded command with the pinned parser, saying so; the confirmation's record
    is a confirmation, never a sweep."""
    raw = json.loads((DOCS / "results.json").read_text())
    assert "schema_version" not in raw and "setup" not in raw  # the committed file as it was written
    with caplog.at_level(logging.INFO):
        pilot = load(DOCS)
    assert pilot.kind == "exploration" and pilot.design is not None and len(pilot.runs) == len(raw["runs"])
    assert pilot.setup is not None and pilot.setup.source == V1_SETUP_SOURCE
    assert "schema 1" in caplog.text and raw["meta"]["command"] in caplog.text
    # what its command resolved to, by hand: the default data, 4 validation batches of 8 x 64, compiled runs
    assert pilot.setup.data == StudyData("embedded", "allenai/c4", "embedded", 64, 8, 0, 1000)
    assert pilot.setup.val_batches == 4 and pilot.setup.settings.compile is True
    assert pilot.setup.roles == raw["meta"]["roles"]
    confirmation = load(DOCS / "confirmation")
    assert confirmation.kind == "confirmation" and confirmation.plan is not None and not confirmation.setup
    assert len(confirmation.runs) == 46


def test_a_schema_1_command_that_cannot_say_leaves_no_setup() -> None:
    meta = {"command": "python -m bhyt_pl study --seq-len 32", "seq_len": 64}  # the command disagrees with meta
    assert upgrade({"meta": meta, "runs": []})["setup"] is None
    assert upgrade({"meta": {"command": "python -m bhyt_pl study --config c.yaml"}, "runs": []})["setup"] is None
    assert (
        upgrade({"meta": {"command": "python -m bhyt_pl study --sweep --quick"}, "runs": []})["setup"]["data"][
            "batch_size"
        ]
        == 4
    )  # the schema-1 quick sweep's default


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

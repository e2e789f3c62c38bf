"""Records from before ``results.json`` was versioned (``bhyt_pl.study.record.upgrade``): a frameless design takes its
frame from ``meta``, the committed schema-1 records load with their kind and (the exploration) the setup the pinned
parser rebuilds from the recorded command, and a command that cannot say leaves no setup."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from study_fixtures import two_group_record

from bhyt_pl.study.record.results import StudyRecord, load
from bhyt_pl.study.record.upgrade import V1_SETUP_SOURCE, upgrade
from bhyt_pl.study.run.data import StudyData

DOCS = Path(__file__).resolve().parents[2] / "docs" / "depth_study"


def test_a_schema_1_design_takes_its_frame_from_meta() -> None:
    record = two_group_record()
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

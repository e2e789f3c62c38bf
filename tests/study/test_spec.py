"""The study's shared types (``bhyt_pl.study.protocol.spec``): a run's status is an enum that reads and writes as its
plain string, a result round-trips through its dict, and labels and folder names are as documented."""

from __future__ import annotations

import json
import math

from bhyt_pl.study.protocol.spec import RunResult, RunSpec, RunStatus, legacy_label, run_dirname, run_label


def test_a_status_is_an_enum_that_reads_and_writes_as_its_string() -> None:
    spec = RunSpec(label="bhyt@lr0.003-steps180-s1", norm="bhyt")
    result = RunResult(spec, status="diverged", diverged_step=12, diverged_loss=math.inf)
    assert result.status is RunStatus.DIVERGED and result.diverged  # a plain string from a record is coerced
    assert f"{result.status}" == "diverged" and str(RunStatus.ERROR) == "error"
    document = json.loads(json.dumps(result.to_dict()))
    assert document["status"] == "diverged"
    again = RunResult.from_dict(document)
    assert again.status is RunStatus.DIVERGED and again.spec == spec
    assert RunResult.from_dict({**document, "status": "ok"}).status is RunStatus.OK


def test_labels_and_folder_names() -> None:
    assert run_label("dyt:alpha_attn=0.5", 3e-3, 180, 2) == "dyt:alpha_attn=0.5@lr0.003-steps180-s2"
    assert run_dirname("bhyt:lambda_attn=0.5@lr0.01-steps40-s0") == "bhyt_lambda_attn=0.5@lr0.01-steps40-s0"
    spec = RunSpec(label="rmsnorm@lr0.001-steps180-s3", norm="rmsnorm", steps=180)
    assert legacy_label(spec) == "rmsnorm@lr0.001-s3"  # the label before labels carried the step count

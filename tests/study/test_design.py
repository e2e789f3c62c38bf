"""The typed design (``bhyt_pl.study.protocol.design``): scheme groups parsed from ``--schemes``, disjoint candidates,
runs
found by key (the rate as run labels write it, never compared as a float), and the design read back from its
``to_dict``."""

from __future__ import annotations

import json

import pytest
from study_fixtures import fake_result, kept_design

from bhyt_pl.study.protocol.design import (
    RunKey,
    Selection,
    StudyDesign,
    StudyRuns,
    check_disjoint,
    parse_group,
    rate_key,
)
from bhyt_pl.study.protocol.spec import RunResult, RunSpec


def test_every_registered_scheme_parses_as_a_group() -> None:
    from bhyt_pl.norms import registered_norms

    for name in registered_norms():
        group = parse_group(name)
        assert group.norm == name and len(group.candidates) == 1


def test_bad_grid_option_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be key=value"):
        parse_group("bhyt:lambda_attn")
    with pytest.raises(ValueError, match="unknown scheme"):
        parse_group("nonorm")


def test_a_grid_group_has_one_candidate_per_combination() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0,alpha_mlp=2.0|4.0")
    assert [v.label for v in group.candidates] == [
        "dyt:alpha_attn=0.5,alpha_mlp=2.0",
        "dyt:alpha_attn=0.5,alpha_mlp=4.0",
        "dyt:alpha_attn=1.0,alpha_mlp=2.0",
        "dyt:alpha_attn=1.0,alpha_mlp=4.0",
    ]
    assert group.candidate("dyt:alpha_attn=1.0,alpha_mlp=4.0").norm_args == {"alpha_attn": 1.0, "alpha_mlp": 4.0}
    with pytest.raises(ValueError, match="has no candidate 'dyt'"):
        group.candidate("dyt")


def test_check_disjoint_names_a_candidate_in_two_groups() -> None:
    groups = [parse_group("dyt:alpha_attn=0.5|1.0"), parse_group("dyt:alpha_attn=2.0|1.0")]
    with pytest.raises(ValueError, match="candidate 'dyt:alpha_attn=1.0' is in both group"):
        check_disjoint(groups)
    check_disjoint([parse_group("dyt:alpha_attn=0.5|1.0"), parse_group("dyt:alpha_attn=2.0")])  # disjoint: fine


def _run(group: str, lr: float, seed: int) -> RunResult:
    return RunResult(RunSpec(label=f"{group}@lr{lr:g}-s{seed}", norm="rmsnorm", group=group, candidate=group, lr=lr,
                             seed_index=seed))  # fmt: skip


def test_runs_are_found_by_key_whatever_float_the_rate_was_written_as() -> None:
    # 0.1 + 0.2 is not 0.3 as a float, but both are the rate "0.3" of a run label
    runs = StudyRuns([_run("a", 0.3, 2), _run("a", 0.3, 1), _run("a", 0.3, 0), _run("a", 1e-3, 1)])
    assert rate_key(0.1 + 0.2) == "0.3" and 0.1 + 0.2 != 0.3
    assert [r.spec.seed_index for r in runs.evaluation("a", "a", 0.1 + 0.2)] == [1, 2]  # seed order, no selection
    assert runs.get(RunKey("a", "a", "0.3", 0)).spec.label == "a@lr0.3-s0"
    assert runs.get(RunKey("a", "a", "0.3", 5)) is None and runs.evaluation("b", "b", 0.3) == []
    assert sorted(runs.seeds("a", "a", 0.3)) == [0, 1, 2] and runs.labelled("a@lr0.001-s1").spec.lr == 1e-3
    with pytest.raises(ValueError, match="two runs with key"):
        StudyRuns([_run("a", 0.3, 1), _run("a", 0.1 + 0.2, 1)])


def test_the_design_reads_back_from_its_dict() -> None:
    groups = (parse_group("rmsnorm"), parse_group("dyt:alpha_attn=0.5|1.0"))
    runs = [fake_result(RunSpec(label=f"{c.label}@lr0.001-s0", norm=c.norm, group=g.label, candidate=c.label, lr=1e-3),
                        3.0) for g in groups for c in g.candidates]  # fmt: skip
    selections = {
        "rmsnorm": Selection("rmsnorm", runs[0], (runs[0],)),
        "dyt:alpha_attn=0.5|1.0": Selection("dyt:alpha_attn=0.5|1.0", runs[2], tuple(runs[1:]), (3e-4,), "lowest"),
    }
    design = StudyDesign(groups, (1e-3, 3e-3), 3, 1, selections, (1e-3,), "given")
    data = json.loads(json.dumps(design.to_dict()))
    assert data["selections"]["dyt:alpha_attn=0.5|1.0"]["run"] == "dyt:alpha_attn=1.0@lr0.001-s0"
    back = StudyDesign.from_dict(data, StudyRuns(runs))
    assert back == design and back.to_dict() == data
    assert back.complete and back.kept("rmsnorm").candidate == "rmsnorm" and back.depth_lr == 1e-3
    with pytest.raises(ValueError, match="names runs that are not among the study's runs"):
        StudyDesign.from_dict(data, StudyRuns(runs[:1]))
    with pytest.raises(ValueError, match=r"design: missing \['groups'\]"):
        StudyDesign.from_dict({k: v for k, v in data.items() if k != "groups"}, StudyRuns(runs))


def test_a_design_refuses_unknown_or_repeated_groups() -> None:
    with pytest.raises(ValueError, match="groups repeat"):
        StudyDesign((parse_group("rmsnorm"), parse_group("rmsnorm")))
    with pytest.raises(ValueError, match="selections of unknown groups"):
        StudyDesign((parse_group("rmsnorm"),), selections={"bhyt": Selection("bhyt", None, ())})
    design = kept_design({"a": 1e-3})
    assert design.kept("b") is None and design.evaluation_runs(StudyRuns([]), "a") == []

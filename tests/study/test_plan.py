"""The protocol's rules (``bhyt_pl.study.protocol.plan``) without training: run lists and labels, the selection's choice
and ties, grid extension at both edges, the default matched rates and the evaluation runs of both arms."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from study_fixtures import BASE, fake_result

from bhyt_pl.study.protocol.design import Selection, parse_group
from bhyt_pl.study.protocol.plan import (
    choose,
    default_matched_lrs,
    evaluation_seeds,
    evaluation_specs,
    extension_lr,
    select,
    selection_specs,
    sweep_specs,
)
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, legacy_label, run_label

GRID = (1e-3, 3e-3, 1e-2)


def test_lr_selection_picks_lowest_validation_loss_and_skips_diverged() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0")
    assert [v.norm_args for v in group.candidates] == [{"alpha_attn": 0.5}, {"alpha_attn": 1.0}]
    base = RunSpec(label="base", norm="rmsnorm", seed=42, data_seed=7)
    specs = selection_specs(group, [1e-3, 1e-2], base)
    assert [s.label for s in specs] == [
        "dyt:alpha_attn=0.5@lr0.001-steps200-s0",
        "dyt:alpha_attn=0.5@lr0.01-steps200-s0",
        "dyt:alpha_attn=1.0@lr0.001-steps200-s0",
        "dyt:alpha_attn=1.0@lr0.01-steps200-s0",
    ]
    losses = [5.0, 4.0, 4.5, math.nan]
    results = [RunResult(spec=s, val_loss=v) for s, v in zip(specs, losses, strict=True)]
    results[3].status = "diverged"
    results[1].status = "diverged"  # the lowest loss, but diverged: not eligible
    winner = choose(results)
    assert winner.spec.label == "dyt:alpha_attn=1.0@lr0.001-steps200-s0"
    assert [(s.seed_index, s.seed, s.data_seed, s.candidate) for s in specs[:1]] == [(0, 42, 7, "dyt:alpha_attn=0.5")]


def test_lr_selection_ties_keep_the_first() -> None:
    group = parse_group("rmsnorm")
    specs = selection_specs(group, [1e-3, 3e-3], RunSpec(label="b", norm="rmsnorm"))
    assert choose([RunResult(spec=s, val_loss=4.0) for s in specs]).spec.lr == 1e-3


def test_selection_ties_keep_the_first_candidate_and_the_lower_rate() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0")
    runs = [fake_result(spec, 3.0) for spec in selection_specs(group, GRID, BASE)]
    chosen = select(group, runs, GRID, 0, BASE)
    assert chosen.chosen.spec.candidate == "dyt:alpha_attn=0.5" and chosen.lr == 1e-3 and chosen.edge == "lowest"


def test_extension_rate_is_one_grid_step_beyond_either_edge() -> None:
    assert extension_lr(1e-3, GRID, GRID) == pytest.approx(1e-3 / 3)  # 3e-3 / 1e-3 = 3 below
    assert extension_lr(1e-2, GRID, GRID) == pytest.approx(1e-2 * 10 / 3)  # 1e-2 / 3e-3 above
    assert extension_lr(3e-3, GRID, GRID) is None  # interior
    assert extension_lr(1e-3, [1e-3], [1e-3]) is None  # one rate: no ratio


def test_select_returns_the_next_extension_run_while_the_best_rate_is_at_an_edge() -> None:
    group = parse_group("rmsnorm")
    runs = [fake_result(s, 3.0 + s.lr * 100) for s in selection_specs(group, GRID, BASE)]  # lowest rate best
    step = select(group, runs, GRID, 1, BASE)
    assert isinstance(step, RunSpec) and step.label == "rmsnorm@lr0.000333333-steps200-s0" and step.seed_index == 0
    runs.append(fake_result(step, 2.0))  # the extension wins and is still the lowest rate tried
    done = select(group, runs, GRID, 1, BASE)
    assert isinstance(done, Selection)
    assert done.lr == pytest.approx(3.33333e-4) and done.extensions == (3.33333e-4,) and done.edge == "lowest"
    assert done.budget == 4
    failed = [fake_result(s, math.inf, status="diverged") for s in selection_specs(group, GRID, BASE)]
    assert select(group, failed, GRID, 1, BASE).chosen is None  # nothing trained: no extension either


def test_default_matched_rates_are_the_highest_at_which_every_kept_candidate_trained() -> None:
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    selections = []
    for g in groups:
        runs = []
        for spec in selection_specs(g, GRID, BASE):
            diverged = g.label == "bhyt" and spec.lr == 1e-2
            runs.append(fake_result(spec, math.inf if diverged else 3.0, status="diverged" if diverged else "ok"))
        selections.append(Selection(g.label, runs[0], tuple(runs)))
    assert default_matched_lrs(selections, GRID) == (1e-3, 3e-3)  # 1e-2: bhyt diverged there
    assert default_matched_lrs(selections, GRID, count=1) == (3e-3,)
    assert default_matched_lrs([*selections, Selection("none", None, ())], GRID) == ()


def test_evaluation_runs_of_both_arms_train_once_and_only_the_best_rate_measures_everything() -> None:
    group = parse_group("rmsnorm")
    chosen = fake_result(selection_specs(group, [3e-3], BASE)[0], 3.0)
    measured = RunSpec(label="base", norm="rmsnorm", stability_every=5, importance=True)
    specs = evaluation_specs(group, Selection("rmsnorm", chosen, (chosen,)), (3e-3, 1e-2), 2, measured)
    assert [s.label for s in specs] == [f"rmsnorm@lr{lr}-steps200-s{i}" for lr in ("0.003", "0.01") for i in (1, 2)]
    assert [(s.stability_every, s.importance) for s in specs] == [(5, True)] * 2 + [(0, False)] * 2
    assert [s.seed for s in specs[:2]] == [BASE.seed + 1, BASE.seed + 2] and list(evaluation_seeds(2)) == [1, 2]
    assert evaluation_specs(group, Selection("rmsnorm", None, ()), (3e-3,), 2, measured) == []


def test_run_labels_carry_the_step_count_and_the_sweep_grid() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0")
    assert run_label(group.candidates[1].label, 3e-4, 180, 2) == "dyt:alpha_attn=1.0@lr0.0003-steps180-s2"
    # a longer run of the same candidate, rate and seed is a run of its own
    assert run_label("bhyt", 3e-3, 540, 1) != run_label("bhyt", 3e-3, 180, 1)
    specs = sweep_specs([group], (2, 4), (1e-2,), 1, BASE)
    assert [s.label for s in specs] == [
        "dyt:alpha_attn=0.5@L2-lr0.01-steps200-s0",
        "dyt:alpha_attn=1.0@L2-lr0.01-steps200-s0",
        "dyt:alpha_attn=0.5@L4-lr0.01-steps200-s0",
        "dyt:alpha_attn=1.0@L4-lr0.01-steps200-s0",
    ]
    assert [s.overrides["n_layers"] for s in specs] == [2, 2, 4, 4]
    assert choose([RunResult(specs[1], val_loss=1.0), RunResult(specs[0], val_loss=1.0)]) is not None


def test_legacy_labels_are_the_labels_without_the_step_count() -> None:
    """What a study folder made before labels carried the step count calls the same run (docs/depth_study.md)."""
    group = parse_group("bhyt:lambda_attn=1.0")
    (spec,) = selection_specs(group, [3e-3], replace(BASE, steps=180))
    assert spec.label == "bhyt:lambda_attn=1.0@lr0.003-steps180-s0"
    assert legacy_label(spec) == "bhyt:lambda_attn=1.0@lr0.003-s0"
    sweep = sweep_specs([group], (16,), (1e-2,), 1, BASE)[0]
    assert legacy_label(sweep) == "bhyt:lambda_attn=1.0@L16-lr0.01-s0"
    assert legacy_label(replace(spec, label="custom")) == "custom"  # a label of another form: itself

"""The protocol drivers (``bhyt_pl.study.launch.execution``) without training: a fake run function whose validation loss
and depth profile are set by hand drives the real scheduler and the in-process launcher (selection seed apart from
the evaluation seeds, grid extension at both edges and the edge flag, matched-arm reuse, reuse of finished runs
across invocations, a fixed run list). The rules themselves: tests/study/test_plan.py."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from study_fixtures import BASE, fake_result

from bhyt_pl.study.launch.execution import adopt_legacy_run, run_all, run_depth_study, run_token_budget
from bhyt_pl.study.launch.inline import InlineLauncher
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.claims import evaluate
from bhyt_pl.study.protocol.design import StudyDesign, parse_group
from bhyt_pl.study.protocol.plan import SELECTION_SEED, default_matched_lrs, evaluation_specs
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, legacy_label, run_dirname
from bhyt_pl.study.protocol.token_budget import BudgetDesign, TokenBudget

GRID = (1e-3, 3e-3, 1e-2)


def fake_runner(loss: Callable[[RunSpec], float], out: Path, trained: list[str]) -> Callable[[RunSpec], RunResult]:
    """A run function that writes ``result.json`` as ``run_one`` does, with the validation loss ``loss(spec)``."""

    def run(spec: RunSpec) -> RunResult:
        trained.append(spec.label)
        value = loss(spec)
        result = fake_result(spec, value, status="ok" if math.isfinite(value) else "diverged")
        path = out / "runs" / run_dirname(spec.label) / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.to_dict(), default=str))
        return result

    return run


def study(groups, loss, out: Path, lrs=GRID, n_seeds=3, extensions=1, matched=None, trained=None):
    trained = [] if trained is None else trained
    scheduler = Scheduler(InlineLauncher(fake_runner(loss, out, trained)), out, resume=True)
    design = StudyDesign(tuple(groups), tuple(lrs), n_seeds, extensions)
    results = run_depth_study(design, BASE, scheduler, matched_lrs=matched)
    return results, design, trained, scheduler


def v_loss(best_lr: float, offset: float = 0.0) -> Callable[[RunSpec], float]:
    """A loss that is lowest at ``best_lr``: 3 + (ln lr - ln best_lr)^2 + offset."""
    return lambda spec: 3.0 + (math.log(spec.lr) - math.log(best_lr)) ** 2 + offset


# ----------------------------------------------------------------------------- selection apart from evaluation
def test_the_selection_seed_is_never_an_evaluation_seed(tmp_path: Path) -> None:
    groups = [parse_group("rmsnorm"), parse_group("dyt:alpha_attn=0.5|1.0")]
    results, design, _, _ = study(groups, v_loss(3e-3), tmp_path, n_seeds=3)
    selection = [r for r in results if r.spec.seed_index == SELECTION_SEED]
    # selection: 1 + 2 candidates x 3 rates, all on seed 42 (index 0); the best rate 3e-3 is interior
    assert len(selection) == 9 and {r.spec.seed for r in selection} == {42}
    assert {g: s.lr for g, s in design.selections.items()} == {"rmsnorm": 3e-3, "dyt:alpha_attn=0.5|1.0": 3e-3}
    # evaluation: seeds 43, 44, 45 (indices 1..3) at the best rate and the matched rates 3e-3, 1e-2
    assert design.matched_lrs == (3e-3, 1e-2)
    for group, s in design.selections.items():
        for lr in (3e-3, 1e-2):
            runs = [r for r in results if r.spec.group == group and r.spec.lr == lr and r.spec.seed_index > 0]
            assert sorted(r.spec.seed for r in runs) == [43, 44, 45]
            assert {r.spec.candidate for r in runs} == {s.candidate}
    # every claim's runs are evaluation runs: none carries the selection seed
    items, _ = evaluate(results, design, {"BHyT": "rmsnorm", "DyT": "dyt:alpha_attn=0.5|1.0"})
    labels = [label for c in items for t in c.tests for label in t.target_runs + t.baseline_runs]
    assert labels and not any(label.endswith("-s0") for label in labels)


# ----------------------------------------------------------------------------- grid extension


@pytest.mark.parametrize(
    ("best", "limit", "extensions", "kept", "edge"),
    [
        # best at 5e-4 (below the grid): 1e-3 at the edge -> 3.33e-4 (|ln| 0.405 < 0.693): kept, still the lowest
        (5e-4, 1, [3.33333e-4], 3.33333e-4, "lowest"),
        # a second extension to 1.11e-4 loses (|ln(1.11e-4/5e-4)| = 1.5): 3.33e-4 is interior, no flag
        (5e-4, 2, [3.33333e-4, 1.11111e-4], 3.33333e-4, ""),
        # best at 2.5e-2 (above): 1e-2 -> 3.33e-2 (|ln| 0.288 < 0.916), still the highest
        (2.5e-2, 1, [3.33333e-2], 3.33333e-2, "highest"),
        (2.5e-2, 2, [3.33333e-2, 1.11111e-1], 3.33333e-2, ""),
        # no extension allowed: flagged at the grid's edge
        (5e-4, 0, [], 1e-3, "lowest"),
        (3e-3, 1, [], 3e-3, ""),
    ],
)
def test_grid_extension_at_both_edges_and_the_flag(
    tmp_path: Path, best: float, limit: int, extensions: list[float], kept: float, edge: str
) -> None:
    groups = [parse_group("rmsnorm")]
    results, design, trained, _ = study(groups, v_loss(best), tmp_path, n_seeds=1, extensions=limit)
    s = design.selections["rmsnorm"]
    assert sorted(s.extensions) == pytest.approx(sorted(extensions))
    assert s.lr == pytest.approx(kept) and s.edge == edge
    assert s.budget == 3 + len(extensions)
    # the extension runs are selection runs (seed index 0) of the kept candidate
    assert sorted(r.spec.lr for r in results if r.spec.seed_index == 0) == pytest.approx(sorted([*GRID, *extensions]))


# ----------------------------------------------------------------------------- matched arm
def test_matched_arm_reuses_the_best_rate_runs(tmp_path: Path) -> None:
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    # rmsnorm's best rate 1e-2 is a matched rate (its runs coincide); bhyt's 3e-3 is not
    loss = lambda spec: v_loss(1e-2 if spec.group == "rmsnorm" else 3e-3)(spec)  # noqa: E731
    results, design, trained, _ = study(groups, loss, tmp_path, lrs=lrs, n_seeds=3)
    assert design.matched_lrs == (1e-2, 3e-2)
    evaluation = [label for label in trained if not label.endswith("-s0")]
    # hand count: rmsnorm 2 rates x 3 seeds (best = 1e-2 coincides), bhyt 3 rates x 3 seeds
    assert len(evaluation) == 6 + 9 == len(set(evaluation))
    assert len(trained) == 8 + 15
    spec_lists = evaluation_specs(groups[0], design.selections["rmsnorm"], design.matched_lrs, 3, BASE)
    assert [s.label for s in spec_lists] == [
        f"rmsnorm@lr{lr:g}-steps200-s{i}" for lr in (0.01, 0.03) for i in (1, 2, 3)
    ]


def test_only_the_reported_runs_measure_stability_and_layer_importance(tmp_path: Path) -> None:
    """The group and importance tables report the best-rate evaluation seeds only: the selection, extension
    and matched-only runs skip both measurements (the best-rate runs of the matched arm keep them)."""
    measured = replace(BASE, stability_every=5, importance=True)
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    lrs = (1e-3, 3e-3, 1e-2, 3e-2)
    loss = lambda spec: v_loss(1e-2 if spec.group == "rmsnorm" else 1e-3)(spec)  # noqa: E731 - bhyt: an extension
    scheduler = Scheduler(InlineLauncher(fake_runner(loss, tmp_path, [])), tmp_path, resume=True)
    design = StudyDesign(tuple(groups), lrs, 2, 1)
    results = run_depth_study(design, measured, scheduler)
    assert design.matched_lrs == (1e-2, 3e-2) and design.selections["bhyt"].extensions
    reported = {(r.spec.group, r.spec.lr) for r in results if r.spec.seed_index > 0}
    assert reported == {("rmsnorm", 1e-2), ("rmsnorm", 3e-2), ("bhyt", 1e-2), ("bhyt", 3e-2), ("bhyt", 1e-3)}
    for r in results:
        best = r.spec.seed_index > 0 and r.spec.lr == design.selections[r.spec.group].lr
        assert (r.spec.stability_every, r.spec.importance) == ((5, True) if best else (0, False)), r.spec.label
    assert sum(r.spec.importance for r in results) == 4  # 2 groups x 2 seeds at their best rates
    no_importance = replace(measured, importance=False)
    specs = evaluation_specs(groups[0], design.selections["rmsnorm"], (3e-2,), 1, no_importance)
    assert [(s.stability_every, s.importance) for s in specs] == [(5, False), (0, False)]


def test_default_matched_rates_skip_a_rate_where_a_group_diverged(tmp_path: Path) -> None:
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]

    def loss(spec: RunSpec) -> float:
        if spec.group == "bhyt" and spec.lr == 1e-2:
            return math.inf  # diverged on the selection seed
        return v_loss(3e-3)(spec)

    _, design, _, _ = study(groups, loss, tmp_path, n_seeds=1)
    assert design.matched_lrs == (1e-3, 3e-3)
    assert default_matched_lrs(list(design.selections.values()), GRID, count=1) == (3e-3,)
    _, given, _, _ = study(groups, loss, tmp_path / "given", n_seeds=1, matched=[1e-3])
    assert given.matched_lrs == (1e-3,) and "--matched-lrs" in given.matched_note


# ----------------------------------------------------------------------------- reuse
def test_finished_runs_are_reused_across_invocations_sharing_out(tmp_path: Path) -> None:
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    first_results, _, first, _ = study(groups, v_loss(3e-3), tmp_path, n_seeds=2)
    assert first
    again: list[str] = []
    results, _, trained, scheduler = study(groups, v_loss(3e-3), tmp_path, n_seeds=2, trained=again)
    assert trained == [] and sorted(scheduler.reused) == sorted(first)
    assert [r.val_loss for r in results] == [r.val_loss for r in first_results]
    # one more evaluation seed: only its runs train (selection and seeds 1-2 are read back)
    more: list[str] = []
    study(groups, v_loss(3e-3), tmp_path, n_seeds=3, trained=more)
    assert sorted(more) == sorted(f"{g}@lr{lr:g}-steps200-s3" for g in ("rmsnorm", "bhyt") for lr in (0.003, 0.01))
    # a changed spec (another step count) is not the finished run: it trains again
    stored = json.loads((tmp_path / "runs" / "rmsnorm@lr0.001-steps200-s0" / "result.json").read_text())
    assert stored["spec"] == json.loads(json.dumps(asdict(replace(BASE, **_fields(stored["spec"])))))
    changed = Scheduler(InlineLauncher(fake_runner(v_loss(3e-3), tmp_path, retrained := [])), tmp_path, True)
    changed.submit([RunSpec(**{**stored["spec"], "steps": 999})])
    list(changed.finished())
    assert retrained == ["rmsnorm@lr0.001-steps200-s0"] and changed.reused == []


def test_a_folder_made_before_labels_carried_the_step_count_is_reused(tmp_path: Path) -> None:
    """Run folders named by the legacy label (no step count) take their current names and are read back, not
    retrained; one whose settings differ (another step count) is left alone and its run trains."""
    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    first_results, _, first, _ = study(groups, v_loss(3e-3), tmp_path, n_seeds=1)
    for label in first:  # the folder as a study made it before: legacy label in its name and in its result.json
        spec = next(r.spec for r in first_results if r.spec.label == label)
        old = legacy_label(spec)
        path = tmp_path / "runs" / run_dirname(label) / "result.json"
        stored = json.loads(path.read_text())
        stored["spec"]["label"], stored["log_dir"] = old, f"runs/{run_dirname(old)}/logs"
        path.write_text(json.dumps(stored))
        path.parent.rename(tmp_path / "runs" / run_dirname(old))
    # one legacy folder of another step count: the same legacy name, but not this study's run
    odd = tmp_path / "runs" / "rmsnorm@lr0.003-s1" / "result.json"
    stored = json.loads(odd.read_text())
    stored["spec"]["steps"] = 999
    odd.write_text(json.dumps(stored))
    results, _, trained, scheduler = study(groups, v_loss(3e-3), tmp_path, n_seeds=1)
    assert trained == ["rmsnorm@lr0.003-steps200-s1"]  # the odd one only
    assert sorted(scheduler.reused) == sorted(label for label in first if label != "rmsnorm@lr0.003-steps200-s1")
    assert [r.val_loss for r in results] == [r.val_loss for r in first_results]
    renamed = json.loads((tmp_path / "runs" / "bhyt@lr0.003-steps200-s1" / "result.json").read_text())
    assert renamed["spec"]["label"] == "bhyt@lr0.003-steps200-s1"
    assert renamed["log_dir"] == "runs/bhyt@lr0.003-steps200-s1/logs"
    assert not (tmp_path / "runs" / "bhyt@lr0.003-s1").exists() and odd.exists()  # the odd one stays as it was
    spec = next(r.spec for r in results if r.spec.label == "bhyt@lr0.003-steps200-s1")
    assert not adopt_legacy_run(tmp_path, spec)  # nothing left to adopt: the folder has its name already


def _fields(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k != "norm_args" or v}


# ----------------------------------------------------------------------------- claims as data


def test_run_all_trains_a_fixed_list_once_and_returns_it_in_order(tmp_path: Path) -> None:
    specs = [replace(BASE, label=f"r{i}", lr=10.0**-i) for i in (3, 1, 2)]
    trained: list[str] = []
    seen: list[str] = []
    scheduler = Scheduler(InlineLauncher(fake_runner(v_loss(1e-2), tmp_path, trained)), tmp_path, resume=True)
    results = run_all([*specs, specs[0]], scheduler, lambda r: seen.append(r.spec.label))
    assert [r.spec.label for r in results] == ["r3", "r1", "r2"]  # the list's order; the repeated spec once
    assert sorted(trained) == sorted(seen) == ["r1", "r2", "r3"]
    assert results[2].val_loss == pytest.approx(3.0)  # lr 1e-2 is v_loss's best
    again: list[str] = []
    scheduler = Scheduler(InlineLauncher(fake_runner(v_loss(1e-2), tmp_path, again)), tmp_path, resume=True)
    assert [r.val_loss for r in run_all(specs, scheduler)] == [r.val_loss for r in results] and again == []


# ----------------------------------------------------------------------------- the token-budget map
def test_the_token_budget_map_selects_per_budget_and_an_heir_takes_its_donor_s_rate(tmp_path: Path) -> None:
    """Budgets of 20, 60 and 180 steps; the best rate moves with the budget (a loss lowest at 1e-2 / (steps / 20)):
    1e-2 at 20 steps, 3.33e-3 nearest 3e-3 at 60; the 180-step budget selects nothing (select_through 2) and
    inherits the 60-step rate. Selection runs train on the selection seed only, evaluation runs on seeds 1..2."""
    budgets = (TokenBudget(0.01, 20, 10), TokenBudget(0.03, 60, 10), TokenBudget(0.09, 180, 10))
    groups = (parse_group("rmsnorm"), parse_group("dyt:alpha_attn=0.5"))
    grids = {"rmsnorm": GRID, "dyt:alpha_attn=0.5": (1e-4, 3e-4, 1e-3)}
    design = BudgetDesign(groups, "rmsnorm", budgets, grids, n_seeds=2, extensions=1, select_through=2)

    def loss(spec: RunSpec) -> float:
        return v_loss(1e-2 / (spec.steps / 20))(spec)

    trained: list[str] = []
    scheduler = Scheduler(InlineLauncher(fake_runner(loss, tmp_path, trained)), tmp_path, resume=True)
    results = run_token_budget(design, BASE, scheduler)
    assert [b.label for b in budgets if b.label in design.selections] == ["0.01", "0.03"]
    assert design.selections["0.01"]["rmsnorm"].lr == 1e-2
    assert design.selections["0.03"]["rmsnorm"].lr == 3e-3
    # dyt's grid tops out at 1e-3: at the edge it extends once, by the grid's top ratio 1e-3 / 3e-4, to 3.33e-3,
    # and is still flagged at 20 steps
    assert design.selections["0.01"]["dyt:alpha_attn=0.5"].lr == 3.33333e-3
    assert design.selections["0.01"]["dyt:alpha_attn=0.5"].edge == "highest"
    heir = design.evaluation_runs(results, budgets[2], "rmsnorm")
    assert sorted(heir) == [1, 2] and {r.spec.lr for r in heir.values()} == {3e-3}
    assert {r.spec.steps for r in heir.values()} == {180} and {r.spec.trajectory_every for r in heir.values()} == {10}
    assert not [r for r in results if r.spec.steps == 180 and r.spec.seed_index == SELECTION_SEED]
    assert {r.spec.seed for r in results if r.spec.seed_index == SELECTION_SEED} == {42}
    # results come back by budget, then group, then seed
    order = [(r.spec.steps, r.spec.group) for r in results]
    assert order == sorted(order, key=lambda k: ([20, 60, 180].index(k[0]), [g.label for g in groups].index(k[1])))
    # 2 groups x 3 rates on two budgets; 3 extensions (rmsnorm at 20 steps tries 3.33e-2 and keeps 1e-2; dyt at 20
    # and at 60 steps, where its best 3.33e-3 lies past its grid); 2 groups x 2 seeds x 3 budgets
    assert len(trained) == 12 + 3 + 12
    assert "rmsnorm@lr0.0333333-steps20-s0" in trained and "dyt:alpha_attn=0.5@lr0.00333333-steps60-s0" in trained

"""Study protocol v3 without training: a fake run function whose validation loss and depth profile are set by
hand drives the real scheduler and protocol (selection seed apart from the evaluation seeds, grid extension
at both edges and the edge flag, matched-arm reuse, reuse of finished runs across invocations), and
synthetic result sets drive the claims table (a claim added as one row, a matched-rate verdict, claims over
training). Rules and Holm: tests/study/test_stats.py."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from study_fixtures import kept_design

from bhyt_pl.study import claims as claims_module
from bhyt_pl.study import metrics as metrics_module
from bhyt_pl.study.claims import CLAIMS, ClaimSpec, evaluate
from bhyt_pl.study.design import StudyDesign, StudyRuns, parse_group
from bhyt_pl.study.local import InlineLauncher
from bhyt_pl.study.metrics import growth, growth_slope
from bhyt_pl.study.plan import (
    SELECTION_SEED,
    default_matched_lrs,
    evaluation_specs,
    extension_lr,
    select,
    selection_specs,
)
from bhyt_pl.study.protocol import run_depth_study
from bhyt_pl.study.runner import RunResult, RunSpec, run_dirname
from bhyt_pl.study.scheduler import Scheduler

BASE = RunSpec(label="base", norm="rmsnorm", seed=42, data_seed=42)
GRID = (1e-3, 3e-3, 1e-2)


def _profile(n: int, first: float, ratio: float) -> list[float]:
    return [first * ratio**i for i in range(n)]


def _stats(magnitude: list[float], variance: list[float]) -> dict[str, float]:
    out = {f"magnitude/layer_{i:02d}": v for i, v in enumerate(magnitude)}
    out.update({f"variance/layer_{i:02d}": v for i, v in enumerate(variance)})
    out.update({f"median_magnitude/layer_{i:02d}": v / 2 for i, v in enumerate(magnitude)})
    return out


def _point(step: int, magnitude: list[float], variance: list[float], val_loss: float) -> dict:
    return {"step": step, "magnitude": magnitude, "variance": variance, "val_loss": val_loss}


def fake_result(spec: RunSpec, loss: float, magnitude: list[float] | None = None, status: str = "ok") -> RunResult:
    magnitude = magnitude or [1.0, 2.0, 3.0, 4.0]
    variance = [m * m for m in magnitude]
    trajectory = [_point(0, [1.0] * len(magnitude), [1.0] * len(magnitude), 10.0)]
    trajectory.append(_point(10, magnitude, variance, loss))
    return RunResult(
        spec=spec,
        status=status,
        n_layers=len(magnitude),
        dim=16,
        steps_done=10,
        val_loss=loss if status == "ok" else math.nan,
        depth_final=_stats(magnitude, variance),
        trajectory=trajectory,
    )


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


def test_selection_ties_keep_the_first_candidate_and_the_lower_rate() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0")
    runs = [fake_result(spec, 3.0) for spec in selection_specs(group, GRID, BASE)]
    chosen = select(group, runs, GRID, 0, BASE)
    assert chosen.chosen.spec.candidate == "dyt:alpha_attn=0.5" and chosen.lr == 1e-3 and chosen.edge == "lowest"


# ----------------------------------------------------------------------------- grid extension
def test_extension_rate_is_one_grid_step_beyond_either_edge() -> None:
    assert extension_lr(1e-3, GRID, GRID) == pytest.approx(1e-3 / 3)  # 3e-3 / 1e-3 = 3 below
    assert extension_lr(1e-2, GRID, GRID) == pytest.approx(1e-2 * 10 / 3)  # 1e-2 / 3e-3 above
    assert extension_lr(3e-3, GRID, GRID) is None  # interior
    assert extension_lr(1e-3, [1e-3], [1e-3]) is None  # one rate: no ratio


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


def test_the_edge_flag_appears_in_every_table_that_uses_the_group(tmp_path: Path) -> None:
    from bhyt_pl.study import report

    groups = [parse_group("rmsnorm"), parse_group("bhyt")]
    loss = lambda spec: v_loss(5e-4 if spec.group == "rmsnorm" else 3e-3)(spec)  # noqa: E731
    results, design, _, _ = study(groups, loss, tmp_path, n_seeds=2, extensions=0)
    assert design.selections["rmsnorm"].edge == "lowest" and design.selections["bhyt"].edge == ""
    runs = StudyRuns(results)
    for table in (report.group_table(runs, design), report.lr_table(runs, design)):
        assert "rmsnorm (edge: lowest)" in table and "bhyt (edge" not in table
    items, _ = evaluate(results, design, {"BHyT": "bhyt", "RMSNorm": "rmsnorm"})
    summary = report.summary_table(items, design)
    best_rows = [line for line in summary.splitlines() if "| best |" in line]
    assert best_rows and all("(edge: rmsnorm)" in line for line in best_rows)
    assert all("(edge:" not in line for line in summary.splitlines() if "| matched |" in line)


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
    assert [s.label for s in spec_lists] == [f"rmsnorm@lr{lr:g}-s{i}" for lr in (0.01, 0.03) for i in (1, 2, 3)]


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
    assert sorted(more) == sorted(f"{g}@lr{lr:g}-s3" for g in ("rmsnorm", "bhyt") for lr in (0.003, 0.01))
    # a changed spec (another step count) is not the finished run: it trains again
    stored = json.loads((tmp_path / "runs" / "rmsnorm@lr0.001-s0" / "result.json").read_text())
    assert stored["spec"] == json.loads(json.dumps(asdict(replace(BASE, **_fields(stored["spec"])))))
    changed = Scheduler(InlineLauncher(fake_runner(v_loss(3e-3), tmp_path, retrained := [])), tmp_path, True)
    changed.submit([RunSpec(**{**stored["spec"], "steps": 999})])
    list(changed.finished())
    assert retrained == ["rmsnorm@lr0.001-s0"] and changed.reused == []


def _fields(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if k != "norm_args" or v}


# ----------------------------------------------------------------------------- claims as data
def _synthetic(group: str, lr: float, seed_index: int, magnitude: list[float], loss: float) -> RunResult:
    spec = replace(
        BASE,
        label=f"{group}@lr{lr:g}-s{seed_index}",
        group=group,
        candidate=group,
        lr=lr,
        seed_index=seed_index,
        norm=group,
    )
    return fake_result(spec, loss, magnitude)


def synthetic_set() -> tuple[list[RunResult], StudyDesign]:
    """Two groups, 3 evaluation seeds, best rates 1e-3 (a) and 3e-3 (b), matched rates 3e-3 and 1e-2.
    Group a's last-layer magnitude is e^-1 of b's at 3e-3 and e^+0.5 at 1e-2 (seed offsets 0, 0.1, -0.1)."""
    results = []
    for i, offset in zip((1, 2, 3), (0.0, 0.1, -0.1), strict=True):
        b = 4.0 * math.exp(offset)
        results.append(_synthetic("b", 3e-3, i, [1.0, 2.0, 3.0, b], 3.0 + offset))
        results.append(_synthetic("b", 1e-2, i, [1.0, 2.0, 3.0, b], 3.2 + offset))
        results.append(_synthetic("a", 3e-3, i, [1.0, 1.0, 1.0, b * math.exp(-1 + offset / 2)], 3.5))
        results.append(_synthetic("a", 1e-2, i, [1.0, 1.0, 1.0, b * math.exp(0.5 + offset / 2)], 3.5))
        results.append(_synthetic("a", 1e-3, i, [1.0, 1.0, 1.0, 1.0], 2.9 + offset + 0.01 * i))
    design = kept_design({"a": 1e-3, "b": 3e-3}, (3e-3, 1e-2))
    return results, design


def test_a_claim_added_as_one_table_row_is_evaluated_by_hand() -> None:
    results, design = synthetic_set()
    row = ClaimSpec(
        "A's median-token magnitude is below B's", "Figure 3", "A", "B", "median_magnitude", "matched", "lower"
    )
    items, skipped = evaluate(results, design, {"A": "a", "B": "b"}, claims=(*CLAIMS, row))
    assert len(skipped) == len(CLAIMS)  # the table's roles have no group here
    (claim,) = items
    # by hand: ln(median_a / median_b) = ln(last_a / last_b) = -1 + offset/2 at 3e-3 and 0.5 + offset/2 at 1e-2
    low, high = claim.tests
    assert [t.rate for t in claim.tests] == ["0.003", "0.01"]
    assert low.difference.mean == pytest.approx(-1.0) and high.difference.mean == pytest.approx(0.5)
    # sd of the offsets/2 (0, 0.05, -0.05) is 0.05; t_{0.975,2} = 4.302653
    half = 4.302653 * 0.05 / math.sqrt(3)
    assert low.difference.high == pytest.approx(-1.0 + half, rel=1e-5)
    assert (low.verdict, high.verdict) == ("reproduced", "not reproduced")
    assert claim.verdict == "depends on the learning rate"
    assert low.target_runs == ["a@lr0.003-s1", "a@lr0.003-s2", "a@lr0.003-s3"]
    assert low.baseline_runs == ["b@lr0.003-s1", "b@lr0.003-s2", "b@lr0.003-s3"]
    data = claim.to_dict()
    assert data["tests"][1]["runs"]["target"] == ["a@lr0.01-s1", "a@lr0.01-s2", "a@lr0.01-s3"]


def test_best_arm_pairs_each_group_at_its_own_rate_and_holm_adjusts_the_family() -> None:
    results, design = synthetic_set()
    rows = (
        ClaimSpec("A's loss is below B's", "Table 1", "A", "B", "val_loss", "best", "lower"),
        ClaimSpec("A ~ B in magnitude", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", margin=0.1),
    )
    items, _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=rows)
    loss, approx = items
    (t,) = loss.tests
    assert t.lrs == (1e-3, 3e-3)
    # by hand: (2.9 + o + 0.01 i) - (3.0 + o) = -0.1 + 0.01 i: -0.09, -0.08, -0.07
    assert t.difference.mean == pytest.approx(-0.08)
    assert t.target_runs[0] == "a@lr0.001-s1" and t.baseline_runs[0] == "b@lr0.003-s1"
    # Holm over the family of 3 tests (1 + 2 matched rates): each adjusted p is m - rank + 1 times the raw
    family = sorted([t, *approx.tests], key=lambda x: x.p_for)
    expected, running = [], 0.0
    for rank, x in enumerate(family):
        running = max(running, min(1.0, (3 - rank) * x.p_for))
        expected.append(running)
    assert [x.holm_p_for for x in family] == pytest.approx(expected)


def test_claims_over_training_on_synthetic_trajectories() -> None:
    results, design = synthetic_set()
    row = ClaimSpec("A's last-layer magnitude is below B's", "Figure 3", "A", "B", "magnitude", "matched", "lower")
    (claim,), _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row,), tokens_per_step=64)
    points = claim.tests[0].over_training
    # step 0: both profiles are all ones -> difference 0 on every seed (sd 0): inconclusive; step 10: the end
    assert [p["step"] for p in points] == [0, 10] and [p["tokens"] for p in points] == [0, 640]
    assert points[0]["mean"] == 0.0 and points[0]["verdict"] == "inconclusive"
    assert points[1]["mean"] == pytest.approx(-1.0) and points[1]["verdict"] == "reproduced"
    assert points[1]["mean"] == pytest.approx(claim.tests[0].difference.mean)


@pytest.mark.parametrize("trajectory", ["kept", "none"])
def test_a_diverged_run_has_no_pair_at_any_point(trajectory: str) -> None:
    """One diverged seed loses its own pair at every step; the other seeds still give every point over training
    (a diverged run records no snapshots, so steps shared by every run would be none)."""
    results, design = synthetic_set()
    diverged = {"status": "diverged"} if trajectory == "kept" else {"status": "diverged", "trajectory": []}
    results = [replace(r, **diverged) if r.spec.label == "a@lr0.003-s1" else r for r in results]
    row = ClaimSpec("A below B", "Figure 3", "A", "B", "magnitude", "matched", "lower")
    (claim,), _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row,))
    points = claim.tests[0].over_training
    assert claim.tests[0].difference.n == 2
    assert [p["step"] for p in points] == [0, 10] and [p["n"] for p in points] == [2, 2]
    assert points[1]["mean"] == pytest.approx(claim.tests[0].difference.mean)


def test_the_theorem_condition_decides_whether_the_claim_applies() -> None:
    results, design = synthetic_set()
    bound = {"kappa": 1.0, "n_layers": 4, "lambda_attn": 0.4, "lambda_mlp": 0.4, "at_init": {"all": True}}
    with_bound = [replace(r, variance_bound=bound) if r.spec.group == "a" else r for r in results]
    row = ClaimSpec(
        "theorem", "theorem", "A", "B", "variance", "matched", "lower", condition="variance_bound", bound=True
    )
    (claim,), _ = evaluate(with_bound, design, {"A": "a", "B": "b"}, claims=(row,))
    assert claim.applies and claim.condition == "lambda/kappa = 0.4 < 1/sqrt(4) = 0.5"
    assert claim.verdict.endswith("(trained last layer vs a bound stated at initialisation)")
    outside = {**bound, "lambda_attn": 0.6, "at_init": {"all": False}}
    failing = [replace(r, variance_bound=outside) if r.spec.group == "a" else r for r in results]
    (claim,), _ = evaluate(failing, design, {"A": "a", "B": "b"}, claims=(row,))
    assert not claim.applies and claim.verdict == "outside the theorem"


def test_claim_rows_reject_unknown_fields() -> None:
    with pytest.raises(ValueError, match="metric must be one of"):
        ClaimSpec("x", "Figure 3", "A", "B", "loudness", "matched", "lower")
    with pytest.raises(ValueError, match="arm must be one of"):
        ClaimSpec("x", "Figure 3", "A", "B", "magnitude", "sometimes", "lower")
    with pytest.raises(ValueError, match="rule must be one of"):
        ClaimSpec("x", "Figure 3", "A", "B", "magnitude", "matched", "smaller")


def test_every_table_row_names_a_paper_statement_and_evaluation_code_names_no_scheme() -> None:
    from bhyt_pl.norms import registered_norms

    assert all(c.source in ("abstract", "Figure 3", "Table 1", "theorem") for c in CLAIMS)
    code = inspect.getsource(claims_module.evaluate) + inspect.getsource(claims_module._test)
    code += inspect.getsource(metrics_module)
    for name in registered_norms():
        assert f'"{name}"' not in code and f"'{name}'" not in code, name


def test_growth_by_hand() -> None:
    # 8 layers, layer L/4 = 2: ln(values[7] / values[1]); a geometric profile has slope ln(ratio) per layer
    values = [100.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert growth(values) == pytest.approx(math.log(8.0 / 2.0))
    assert growth_slope(_profile(8, 1.0, 1.5)) == pytest.approx(math.log(1.5))
    assert growth([1.0, 1.0, 1.0, 1.0]) == 0.0 and math.isnan(growth([0.0, 1.0, 1.0, 1.0]))


def test_seeds_for_a_decisive_tost_use_its_90_percent_interval() -> None:
    """The detail table's 'seeds for a decisive CI' of an equivalence claim: t_{0.95} (the TOST's 90 % interval)."""
    from bhyt_pl.study import report

    results, design = synthetic_set()
    row = ClaimSpec("A ~ B", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", margin=1.05)
    items, _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row,))
    low = items[0].tests[0]
    # mean -1, sd 0.05, 3 pairs: room 0.05; the 90 % half-width t_{0.95,2} 0.05 / sqrt(3) = 0.084 does not fit
    assert low.rate == "0.003" and low.verdict == "inconclusive"
    # smallest n with t_{0.95,n-1} / sqrt(n) < 1: n = 5 (2.132 / 2.236 = 0.953; n = 4: 2.353 / 2 = 1.18);
    # the 95 % interval's t_{0.975} would say n = 7 (2.447 / 2.646 = 0.925; n = 6: 2.571 / 2.449 = 1.05)
    line = next(x for x in report.detail_table(items).splitlines() if "| 0.003 |" in x)
    assert line.rstrip(" |").endswith("| 5")

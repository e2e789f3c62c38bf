"""The study's claim evaluation (``bhyt_pl.study.protocol.claims.evaluate`` over the ``CLAIMS`` table) on a synthetic
result set, against intervals and verdicts worked out by hand from the numbers below (3 evaluation seeds:
t(0.975, 2) = 4.3027, t(0.95, 2) = 2.9200). Every group trains at one rate (1e-3), its best and the one
matched rate, so both arms read the same runs."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace

import pytest
from study_fixtures import kept_design, synthetic_set

from bhyt_pl.study.protocol import claims as claims_module
from bhyt_pl.study.protocol import metrics as metrics_module
from bhyt_pl.study.protocol.claims import (
    CLAIMS,
    CONFIRMATION_ROWS,
    PAPER_CLAIMS,
    POST_HOC,
    ClaimSpec,
    PaperClaimSpec,
    evaluate,
)
from bhyt_pl.study.protocol.design import StudyDesign
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.protocol.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

T_975_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom
BOUND_NOTE = " (trained last layer vs a bound stated at initialisation)"

# per group, 3 seeds: final val loss, last-layer magnitude, last-layer variance
DATA = {
    "bhyt": ([3.00, 3.10, 2.95], [1.0, 1.1, 0.9], [0.10, 0.12, 0.09]),
    "bhyt_exact": ([3.01, 3.09, 2.96], [1.01, 1.09, 0.91], [0.20, 0.24, 0.18]),
    "rmsnorm": ([3.10, 3.20, 3.06], [4.0, 4.4, 3.6], [0.50, 0.60, 0.45]),
    "lns": ([3.02, 3.11, 2.99], [2.0, 2.2, 1.8], [0.10, 0.12, 0.09]),
    "dyt": ([3.50, 3.60, 3.40], [0.5, 0.55, 0.45], [0.05, 0.06, 0.045]),
    "derf": ([9.0, 9.0, 9.0], [9.0, 9.0, 9.0], [9.0, 9.0, 9.0]),  # plays no role: in no claim
}
BOUNDS = {  # the runner's variance_bound diagnostic: kappa 10, 4 layers (threshold 0.5)
    "bhyt": {"kappa": 10.0, "n_layers": 4, "lambda_attn": 2.0, "lambda_mlp": 1.0, "at_init": {"all": True}},
    "bhyt_exact": {"kappa": 10.0, "n_layers": 4, "lambda_attn": 6.0, "lambda_mlp": 1.0, "at_init": {"all": False}},
}
ROLES = {"BHyT": "bhyt", "BHyT*": "bhyt_exact", "RMSNorm": "rmsnorm", "LNS": "lns", "DyT": "dyt"}


def _study(data: dict) -> tuple[list[RunResult], StudyDesign]:
    results = []
    for group, (loss, magnitude, variance) in data.items():
        for seed in (1, 2, 3):
            spec = RunSpec(
                label=f"{group}@lr0.001-s{seed}", norm="rmsnorm", group=group, candidate=group, lr=1e-3, seed_index=seed
            )
            depth = {"magnitude/layer_00": 99.0, "magnitude/layer_01": magnitude[seed - 1]}  # the last layer counts
            depth.update({"variance/layer_00": 9.0, "variance/layer_01": variance[seed - 1]})
            results.append(
                RunResult(
                    spec, n_layers=2, val_loss=loss[seed - 1], depth_final=depth, variance_bound=BOUNDS.get(group)
                )
            )
    design = kept_design({g: 1e-3 for g in data}, (1e-3,))
    return results, design


def _interval(differences: list[float]) -> tuple[float, float, float]:
    n = len(differences)
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = T_975_2 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def _ln_diff(a: list[float], b: list[float]) -> list[float]:
    return [math.log(x) - math.log(y) for x, y in zip(a, b, strict=True)]


def _diff(a: list[float], b: list[float]) -> list[float]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _by_key(items) -> dict:
    return {(c.spec.statement, c.spec.metric, c.target, c.baseline): c for c in items}


def test_claims_verdicts_and_intervals_match_hand_computation() -> None:
    items, skipped = evaluate(*_study(DATA), ROLES)
    got = _by_key(items)
    mag, var = "BHyT has the lowest last-layer magnitude", "BHyT has the lowest last-layer variance"
    theorem = "the last-layer variance is below LNS's where lambda/kappa < 1/sqrt(L)"
    expected = {
        (mag, "magnitude", "bhyt", "rmsnorm"): REPRODUCED,  # ln 1/4 on every seed
        (mag, "magnitude", "bhyt", "lns"): REPRODUCED,
        (mag, "magnitude", "bhyt", "dyt"): NOT_REPRODUCED,  # ln 2: DyT is lower
        (var, "variance", "bhyt", "rmsnorm"): REPRODUCED,
        (var, "variance", "bhyt", "lns"): INCONCLUSIVE,  # equal: CI [0, 0]
        (var, "variance", "bhyt", "dyt"): NOT_REPRODUCED,
        ("BHyT's loss is no worse than RMSNorm's", "val_loss", "bhyt", "rmsnorm"): REPRODUCED,
        # TOST at +-0.02: differences -0.01, 0.01, -0.01; 90% CI -0.0033 +- 2.92 * 0.00667 = [-0.0228, 0.0161]
        # reaches below -0.02: not shown equivalent, and the 95% CI is not wholly outside either
        ("BHyT ~ BHyT* in loss", "val_loss", "bhyt", "bhyt_exact"): INCONCLUSIVE,
        ("BHyT ~ BHyT* in last-layer magnitude", "magnitude", "bhyt", "bhyt_exact"): REPRODUCED,
        ("BHyT ~ BHyT* in last-layer variance", "variance", "bhyt", "bhyt_exact"): NOT_REPRODUCED,  # ln 1/2 > 0.4
        ("the 1B eval-loss ordering BHyT < LNS < RMSNorm < Peri-LN < DyT", "val_loss", "bhyt", "lns"): INCONCLUSIVE,
        ("the 1B eval-loss ordering BHyT < LNS < RMSNorm < Peri-LN < DyT", "val_loss", "lns", "rmsnorm"): REPRODUCED,
        (theorem, "variance", "bhyt", "lns"): INCONCLUSIVE + BOUND_NOTE,
        (theorem, "variance", "bhyt_exact", "lns"): "outside the theorem",
    }
    for key, verdict in expected.items():
        assert got[key].verdict == verdict, key
    # no Peri-LN group: neither RMSNorm < Peri-LN nor Peri-LN < DyT; derf plays no role
    assert all("derf" not in (c.target, c.baseline) for c in items)
    assert {(c.target, c.baseline) for c in skipped} >= {("RMSNorm", "Peri-LN"), ("Peri-LN", "DyT")}
    assert got[(theorem, "variance", "bhyt", "lns")].condition == "lambda/kappa = 0.2 < 1/sqrt(4) = 0.5"
    cases = [
        (
            ("BHyT's loss is no worse than RMSNorm's", "val_loss", "bhyt", "rmsnorm"),
            _diff(DATA["bhyt"][0], DATA["rmsnorm"][0]),
        ),
        (("BHyT ~ BHyT* in loss", "val_loss", "bhyt", "bhyt_exact"), _diff(DATA["bhyt"][0], DATA["bhyt_exact"][0])),
        (
            ("BHyT ~ BHyT* in last-layer magnitude", "magnitude", "bhyt", "bhyt_exact"),
            _ln_diff(DATA["bhyt"][1], DATA["bhyt_exact"][1]),
        ),
        (
            ("the 1B eval-loss ordering BHyT < LNS < RMSNorm < Peri-LN < DyT", "val_loss", "bhyt", "lns"),
            _diff(DATA["bhyt"][0], DATA["lns"][0]),
        ),
    ]
    for key, differences in cases:
        (test,) = got[key].tests
        mean, low, high = _interval(differences)
        assert test.difference.n == 3
        assert (test.difference.mean, test.difference.low, test.difference.high) == pytest.approx(
            (mean, low, high), abs=1e-9
        )


def test_a_diverged_seed_has_no_pair_and_two_pairs_still_give_an_interval() -> None:
    results, design = _study({k: DATA[k] for k in ("bhyt", "rmsnorm")})
    next(r for r in results if r.spec.label == "rmsnorm@lr0.001-s3").status = "diverged"
    items, _ = evaluate(results, design, ROLES)
    (loss,) = _by_key(items)[("BHyT's loss is no worse than RMSNorm's", "val_loss", "bhyt", "rmsnorm")].tests
    mean, low, high = _interval(_diff(DATA["bhyt"][0][:2], DATA["rmsnorm"][0][:2]))
    t_975_1 = 12.706204736174698
    assert loss.difference.n == 2 and loss.difference.mean == pytest.approx(mean)
    assert loss.difference.high - loss.difference.mean == pytest.approx((high - mean) * t_975_1 / T_975_2)


def test_claims_follow_roles_not_labels() -> None:
    # the group labelled "bhyt_exact" plays BHyT here and "rmsnorm" plays BHyT*: the roles decide, not the names
    results, design = _study({k: DATA[k] for k in ("bhyt_exact", "rmsnorm")})
    items, skipped = evaluate(results, design, {"BHyT": "bhyt_exact", "BHyT*": "rmsnorm"})
    assert {(c.target, c.baseline) for c in items} == {("bhyt_exact", "rmsnorm")}
    assert len(items) + len(skipped) == len(CLAIMS)
    results, design = _study({k: DATA[k] for k in ("derf", "rmsnorm")})
    assert evaluate(results, design, {"RMSNorm": "rmsnorm"})[0] == []  # derf plays no role


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


def test_a_row_declaring_a_phase_pairs_that_phases_values_by_hand() -> None:
    results, design = synthetic_set()
    # group a starts with a last layer of e^0.3 (every other layer, and group b, start at 1)
    for i, r in enumerate(results):
        if r.spec.group == "a":
            start = dict(r.trajectory[0], magnitude=[1.0, 1.0, 1.0, math.exp(0.3)])
            results[i] = replace(r, trajectory=[start, *r.trajectory[1:]])
    rows = [
        ClaimSpec("A's magnitude is below B's", "Figure 3", "A", "B", "magnitude", "matched", "lower", phase=phase)
        for phase in ("init", "end", "training")
    ]
    assert [row.name for row in rows] == [
        "A < B: magnitude, at initialisation",
        "A < B: magnitude",
        "A < B: magnitude, made by training",
    ]
    items, _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=rows)
    # by hand at 3e-3: d = -1 + offset/2 at the end, 0.3 - 0 at step 0, so -1.3 + offset/2 made by training
    assert [c.tests[0].difference.mean for c in items] == [pytest.approx(0.3), pytest.approx(-1.0), pytest.approx(-1.3)]
    assert [c.tests[1].difference.mean for c in items] == [pytest.approx(0.3), pytest.approx(0.5), pytest.approx(0.2)]
    # the record names a phase other than the end, and only then
    assert [c.to_dict().get("phase") for c in items] == ["init", None, "training"]
    # claims over training read each step's own value, whatever the phase
    assert items[2].tests[0].over_training == items[1].tests[0].over_training
    with pytest.raises(ValueError, match="phase must be one of .*, got 'later'"):
        ClaimSpec("x", "Figure 3", "A", "B", "magnitude", "matched", "lower", phase="later")


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


def test_a_tost_point_over_training_carries_the_90_percent_interval_it_is_decided_by() -> None:
    results, design = synthetic_set()
    row = ClaimSpec("A ~ B", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", margin=1.05)
    (claim,), _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row,))
    end, test = claim.tests[0].over_training[-1], claim.tests[0]
    assert end["confidence"] == 0.90 and (end["low"], end["high"]) == (test.difference_90.low, test.difference_90.high)
    lower = ClaimSpec("A below B", "Figure 3", "A", "B", "magnitude", "matched", "lower")
    (claim,), _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(lower,))
    end = claim.tests[0].over_training[-1]
    assert end["confidence"] == 0.95 and end["low"] == claim.tests[0].difference.low


def test_the_confirmations_declarations_are_rows_of_the_table() -> None:
    """Every row says whether it is a primary candidate and why; primary rows are directional tests at the matched
    rate; names are unique; the post-hoc rows stay out of the exploration; paper claims name rows."""
    assert CONFIRMATION_ROWS == (*POST_HOC, *CLAIMS) and len({c.name for c in CONFIRMATION_ROWS}) == 51
    assert all(c.why for c in CONFIRMATION_ROWS)
    primary = [c for c in CONFIRMATION_ROWS if c.primary]
    assert all(c.arm == "matched" and c.rule in ("lower", "higher") for c in primary)
    assert all(c.target != "DyT" and c.baseline != "DyT" for c in primary) and len(primary) == 28
    assert {c.metric for c in POST_HOC} == {"median_magnitude"} and not any(
        c.primary for c in CLAIMS if c.metric == "magnitude"
    )
    results, design = _study(DATA)
    items, skipped = evaluate(results, design, ROLES)
    assert len(items) + len(skipped) == len(CLAIMS) == 46  # the exploration's table, without the post-hoc rows
    assert all(c.spec.metric != "median_magnitude" for c in items)
    (three,) = [c for c in PAPER_CLAIMS if "RMSNorm's, LayerNorm's and Peri-LN's" in c.statement]
    assert three.components == tuple(f"BHyT < {b}: median_magnitude" for b in ("RMSNorm", "LayerNorm", "Peri-LN"))
    lowest = [c for c in PAPER_CLAIMS if " has the lowest " in c.statement]
    assert len(lowest) == 7 and all(len(c.components) == 5 for c in lowest)  # every baseline, DyT's included


def test_a_primary_row_must_be_a_directional_matched_test_with_its_reason() -> None:
    with pytest.raises(ValueError, match="a primary row is one directional test at the matched rate"):
        ClaimSpec("x", "Table 1", "A", "B", "val_loss", "best", "lower", primary=True, why="Table 1")
    with pytest.raises(ValueError, match="got arm 'matched' and rule 'equivalent'"):
        ClaimSpec("x", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", primary=True, why="w")
    with pytest.raises(ValueError, match=r"a primary row needs its reason \(why='...'\)"):
        ClaimSpec("x", "Figure 3", "A", "B", "magnitude", "matched", "lower", primary=True)
    with pytest.raises(ValueError, match="components must name rows of the table"):
        PaperClaimSpec("lowest", ("BHyT < RMSNorm: loudness",))
    row = ClaimSpec("x", "theorem", "A", "B", "variance", "matched", "lower", condition="variance_bound")
    assert row.name == "A < B: variance [theorem]"

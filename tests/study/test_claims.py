"""The study's claim evaluation (``bhyt_pl.study.claims.evaluate`` over the ``CLAIMS`` table) on a synthetic
result set, against intervals and verdicts worked out by hand from the numbers below (3 evaluation seeds:
t(0.975, 2) = 4.3027, t(0.95, 2) = 2.9200). Every group trains at one rate (1e-3), its best and the one
matched rate, so both arms read the same runs."""

from __future__ import annotations

import math

import pytest
from study_fixtures import kept_design

from bhyt_pl.study.claims import CLAIMS, evaluate
from bhyt_pl.study.design import StudyDesign
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.study.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

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

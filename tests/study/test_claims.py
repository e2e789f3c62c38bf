"""The study's claim evaluation (``bhyt_pl.study.report.claims``) on a synthetic result set, against
intervals and verdicts worked out by hand from the numbers below (3 seeds: t(0.975, 2) = 4.3027)."""

from __future__ import annotations

import math

import pytest

from bhyt_pl.study.plan import parse_group
from bhyt_pl.study.report import ROLES, claims
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.study.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

T_975_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom

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


def _study(data: dict) -> tuple[list[RunResult], list, dict[str, str]]:
    groups = [parse_group(text) for text in data]
    results, chosen = [], {}
    for g in groups:
        loss, magnitude, variance = data[g.label]
        for seed in range(3):
            label = f"{g.label}@lr0.001-s{seed}"
            spec = RunSpec(label=label, norm=g.norm, norm_args=dict(g.candidates[0].norm_args), group=g.label)
            depth = {"magnitude/layer_00": 99.0, "magnitude/layer_01": magnitude[seed]}  # the last layer counts
            depth["variance/layer_01"] = variance[seed]
            bound = BOUNDS.get(g.label)
            results.append(RunResult(spec, val_loss=loss[seed], depth_final=depth, variance_bound=bound))
        chosen[g.label] = f"{g.label}@lr0.001-s0"
    return results, groups, chosen


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


def test_claims_verdicts_and_intervals_match_hand_computation() -> None:
    out = claims(*_study(DATA))
    got = [(c.claim, c.comparison, c.verdict.label) for c in out]
    theorem = "theorem: BHyT variance below LNS's"
    assert got == [
        ("BHyT has the lowest last-layer magnitude", "ln bhyt - ln rmsnorm", REPRODUCED),  # ln 1/4 each seed
        ("BHyT has the lowest last-layer magnitude", "ln bhyt - ln lns", REPRODUCED),
        ("BHyT has the lowest last-layer magnitude", "ln bhyt - ln dyt", NOT_REPRODUCED),  # ln 2: DyT is lower
        ("BHyT has the lowest last-layer variance", "ln bhyt - ln rmsnorm", REPRODUCED),
        ("BHyT has the lowest last-layer variance", "ln bhyt - ln lns", INCONCLUSIVE),  # equal: CI [0, 0]
        ("BHyT has the lowest last-layer variance", "ln bhyt - ln dyt", NOT_REPRODUCED),
        ("BHyT's loss is no worse than RMSNorm's", "val loss bhyt - rmsnorm", REPRODUCED),
        ("BHyT ~ BHyT* in loss", "val loss bhyt - bhyt_exact", REPRODUCED),
        ("BHyT ~ BHyT* in last-layer magnitude", "ln bhyt - ln bhyt_exact", REPRODUCED),
        ("BHyT ~ BHyT* in last-layer variance", "ln bhyt - ln bhyt_exact", NOT_REPRODUCED),  # ln 1/2 each seed
        ("1B eval-loss ordering: BHyT < LNS", "val loss bhyt - lns", INCONCLUSIVE),
        ("1B eval-loss ordering: LNS < RMSNorm", "val loss lns - rmsnorm", REPRODUCED),
        # no Peri-LN group: neither RMSNorm < Peri-LN nor Peri-LN < DyT (adjacent pairs only)
        (f"{theorem} (lambda/kappa = 0.2 < 1/sqrt(4) = 0.5)", "ln bhyt - ln lns (last-layer variance)", INCONCLUSIVE),
        (
            f"{theorem} (lambda/kappa = 0.6 >= 1/sqrt(4) = 0.5)",
            "ln bhyt_exact - ln lns (last-layer variance)",
            "outside the theorem",
        ),
    ]
    by_comparison = {(c.claim, c.comparison): c for c in out}
    cases = [
        (
            "BHyT's loss is no worse than RMSNorm's",
            "val loss bhyt - rmsnorm",
            _diff(DATA["bhyt"][0], DATA["rmsnorm"][0]),
        ),
        ("BHyT ~ BHyT* in loss", "val loss bhyt - bhyt_exact", _diff(DATA["bhyt"][0], DATA["bhyt_exact"][0])),
        (
            "BHyT ~ BHyT* in last-layer magnitude",
            "ln bhyt - ln bhyt_exact",
            _ln_diff(DATA["bhyt"][1], DATA["bhyt_exact"][1]),
        ),
        ("1B eval-loss ordering: BHyT < LNS", "val loss bhyt - lns", _diff(DATA["bhyt"][0], DATA["lns"][0])),
        ("1B eval-loss ordering: LNS < RMSNorm", "val loss lns - rmsnorm", _diff(DATA["lns"][0], DATA["rmsnorm"][0])),
    ]
    for claim, comparison, differences in cases:
        c = by_comparison[(claim, comparison)]
        mean, low, high = _interval(differences)
        assert c.difference.n == 3
        assert (c.difference.mean, c.difference.low, c.difference.high) == pytest.approx((mean, low, high), abs=1e-9)
    # room: the distance from the mean to the decision boundary in the paper's favour
    loss = by_comparison[("BHyT's loss is no worse than RMSNorm's", "val loss bhyt - rmsnorm")]
    assert loss.room == pytest.approx(0.02 - _interval(cases[0][2])[0])
    approx = by_comparison[("BHyT ~ BHyT* in loss", "val loss bhyt - bhyt_exact")]
    assert approx.room == pytest.approx(0.05 - abs(_interval(cases[1][2])[0]))


def test_a_diverged_seed_has_no_pair_and_two_pairs_still_give_an_interval() -> None:
    results, groups, chosen = _study({k: DATA[k] for k in ("bhyt", "rmsnorm")})
    diverged = next(r for r in results if r.spec.label == "rmsnorm@lr0.001-s2")
    diverged.status = "diverged"
    out = {c.comparison: c for c in claims(results, groups, chosen)}
    loss = out["val loss bhyt - rmsnorm"]
    mean, low, high = _interval(_diff(DATA["bhyt"][0][:2], DATA["rmsnorm"][0][:2]))
    t_975_1 = 12.706204736174698
    assert loss.difference.n == 2 and loss.difference.mean == pytest.approx(mean)
    assert loss.difference.high - loss.difference.mean == pytest.approx((high - mean) * t_975_1 / T_975_2)


def test_claims_follow_roles_not_labels_and_exact_layers_groups_only_meet_bhyt_star() -> None:
    assert set(ROLES) >= {"BHyT", "BHyT*", "RMSNorm", "LNS", "Peri-LN", "DyT"}
    data = {"bhyt_exact": DATA["bhyt_exact"], "bhyt:exact_layers=1": DATA["bhyt"], "rmsnorm": DATA["rmsnorm"]}
    out = claims(*_study(data))
    # the exact_layers variant is compared with BHyT* only; with no plain BHyT group nothing else is claimed
    assert [(c.claim, c.comparison) for c in out] == [
        ("BHyT ~ BHyT* in loss", "val loss bhyt:exact_layers=1 - bhyt_exact"),
        ("BHyT ~ BHyT* in last-layer magnitude", "ln bhyt:exact_layers=1 - ln bhyt_exact"),
        ("BHyT ~ BHyT* in last-layer variance", "ln bhyt:exact_layers=1 - ln bhyt_exact"),
    ]
    assert claims(*_study({"derf": DATA["derf"], "rmsnorm": DATA["rmsnorm"]})) == []

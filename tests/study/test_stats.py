"""Seed aggregation of the study: t-intervals, the verdict rules' p-values (directional, non-inferiority, TOST)
and Holm's adjustment against hand computations, and paired differences."""

from __future__ import annotations

import math

import pytest

from bhyt_pl.study.protocol import stats


def test_interval_matches_a_hand_computation() -> None:
    # values 1, 2, 4: mean 7/3, sample sd sqrt(((4/3)^2 + (1/3)^2 + (5/3)^2) / 2) = sqrt(7/3);
    # t_{0.975, 2} = 4.303 (table value)
    iv = stats.interval([1.0, 2.0, 4.0])
    half = 4.302653 * math.sqrt(7 / 3) / math.sqrt(3)
    assert iv.n == 3 and iv.mean == pytest.approx(7 / 3)
    assert iv.low == pytest.approx(7 / 3 - half, rel=1e-5) and iv.high == pytest.approx(7 / 3 + half, rel=1e-5)
    assert (iv.minimum, iv.maximum) == (1.0, 4.0)


def test_interval_leaves_out_non_finite_values_and_needs_two() -> None:
    iv = stats.interval([1.0, math.nan, 3.0, math.inf])  # n=2: t_{0.975, 1} = 12.706, sd = sqrt(2)
    assert iv.n == 2 and iv.high - iv.mean == pytest.approx(12.7062 * math.sqrt(2) / math.sqrt(2), rel=1e-4)
    one = stats.interval([5.0])
    assert one.n == 1 and one.mean == 5.0 and not one.defined
    assert stats.interval([]).n == 0


def test_paired_differences_pair_by_seed_and_skip_diverged() -> None:
    a = {0: 3.0, 1: 2.5, 2: math.nan}
    b = {0: 3.5, 1: 2.0, 2: 1.0, 3: 9.0}
    assert stats.paired_differences(a, b) == [-0.5, 0.5]


def _t2_cdf(t: float) -> float:
    """Student t CDF with 2 degrees of freedom in closed form: 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_directional_p_values_by_hand() -> None:
    # values -0.3, -0.2, -0.25: mean -0.25, sd 0.05, se 0.05/sqrt(3); t = -8.660 with 2 df
    iv = stats.interval([-0.3, -0.2, -0.25])
    t = -0.25 / (0.05 / math.sqrt(3))
    p_for, p_against = stats.rule_p_values(iv, "lower")
    assert p_for == pytest.approx(2 * _t2_cdf(t), rel=1e-6) and p_against == 1.0
    assert stats.label_from_p(p_for, p_against) == "reproduced" and iv.high < 0  # the 95% CI excludes 0
    p_for, p_against = stats.rule_p_values(iv, "higher")
    assert p_against == pytest.approx(2 * _t2_cdf(t)) and stats.label_from_p(p_for, p_against) == "not reproduced"


def test_no_worse_p_values_by_hand() -> None:
    # values 0.0, 0.01, 0.02: mean 0.01, sd 0.01; margin 0.02: t = (0.01 - 0.02) / (0.01/sqrt(3)) = -1.732
    iv = stats.interval([0.0, 0.01, 0.02])
    p_for, _ = stats.rule_p_values(iv, "no_worse", 0.02)
    assert p_for == pytest.approx(2 * _t2_cdf(-math.sqrt(3)), rel=1e-6)  # 0.225: the upper 95% bound 0.035 > 0.02
    assert stats.label_from_p(*stats.rule_p_values(iv, "no_worse", 0.02)) == "inconclusive"
    assert stats.label_from_p(*stats.rule_p_values(iv, "no_worse", 0.04)) == "reproduced"  # 0.035 < 0.04


@pytest.mark.parametrize(("margin", "label"), [(0.05, "reproduced"), (0.04, "inconclusive")])
def test_tost_by_hand(margin: float, label: str) -> None:
    # values 0.01, 0.03, -0.01: mean 0.01, sd 0.02, se 0.02/sqrt(3); 90% CI = 0.01 +- 2.919986 se = [-0.0237, 0.0437]
    values = [0.01, 0.03, -0.01]
    se = 0.02 / math.sqrt(3)
    iv = stats.interval(values)
    p_for, p_against = stats.rule_p_values(iv, "equivalent", margin)
    expected = max(1 - _t2_cdf((0.01 + margin) / se), _t2_cdf((0.01 - margin) / se))
    assert p_for == pytest.approx(expected, rel=1e-6)  # 0.0371 at 0.05, 0.0609 at 0.04
    assert stats.label_from_p(p_for, p_against) == label
    ninety = stats.interval(values, confidence=0.90)
    assert ninety.high == pytest.approx(0.01 + 2.919986 * se, rel=1e-5)
    assert (ninety.high < margin and ninety.low > -margin) == (label == "reproduced")


def test_tost_not_reproduced_when_the_interval_lies_outside_the_margin() -> None:
    iv = stats.interval([0.3, 0.31, 0.32])
    p_for, p_against = stats.rule_p_values(iv, "equivalent", 0.05)
    assert p_for > 0.5 and stats.label_from_p(p_for, p_against) == "not reproduced" and iv.low > 0.05


def test_holm_by_hand() -> None:
    # 4 finite p-values sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    adjusted = stats.holm([0.01, 0.04, 0.03, math.nan, 0.005])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and adjusted[4] == pytest.approx(0.02)
    assert math.isnan(adjusted[3])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, then monotone


def test_combine_over_rates() -> None:
    assert stats.combine(["reproduced", "reproduced"]) == "reproduced"
    assert stats.combine(["reproduced", "not reproduced"]) == "depends on the learning rate"
    assert stats.combine([]) == "inconclusive"


def test_undefined_interval_is_inconclusive() -> None:
    one = stats.interval([0.5])
    for rule, margin in (("lower", 0.0), ("no_worse", 0.02), ("equivalent", 0.05)):
        assert stats.label_from_p(*stats.rule_p_values(one, rule, margin)) == "inconclusive"
    with pytest.raises(ValueError, match="rule must be one of"):
        stats.rule_p_values(one, "smaller")


def test_seeds_needed_for_a_decisive_interval() -> None:
    # mean -0.1, sd 0.2 (from 3 values): n seeds give half-width t_{n-1} * 0.2 / sqrt(n) < 0.1 first at n = 18
    iv = stats.interval([-0.3, -0.1, 0.1])
    assert iv.sd == pytest.approx(0.2)
    assert stats.seeds_needed(iv, room=0.1) == 18  # t_16 = 2.120: 2.120 * 0.2 / sqrt(17) = 0.1028 >= 0.1
    assert stats.seeds_needed(iv, room=-0.1) is None  # the mean is on the wrong side
    # a TOST decides on its 90 % interval: t_{0.95, n-1} * 0.2 / sqrt(n) < 0.1 first at n = 13
    # (t_{0.95,12} = 1.782: 0.0989; n = 12: t_{0.95,11} = 1.796, 1.796 * 0.2 / sqrt(12) = 0.1037 >= 0.1)
    assert stats.seeds_needed(iv, room=0.1, confidence=0.90) == 13


# --- the confirmation's tests: one-sided p-values, intersection-union, geometric means --------------------------


def test_one_sided_p_by_hand() -> None:
    # values -0.3, -0.2, -0.25: mean -0.25, sd 0.05, se 0.05/sqrt(3); t = -8.660 with 2 df
    iv = stats.interval([-0.3, -0.2, -0.25])
    t = -0.25 / (0.05 / math.sqrt(3))
    assert stats.one_sided_p(iv, "lower") == pytest.approx(_t2_cdf(t), rel=1e-9)  # P(T <= t) = 0.00654
    assert stats.one_sided_p(iv, "higher") == pytest.approx(1 - _t2_cdf(t), rel=1e-9)
    # half the two-sided p of the exploration's rule on the claim's side
    assert stats.one_sided_p(iv, "lower") == pytest.approx(stats.rule_p_values(iv, "lower")[0] / 2)
    # against a margin: "no worse than +0.02" is lower against +0.02; t = (-0.25 - 0.02) / se
    t_margin = (-0.25 - 0.02) / (0.05 / math.sqrt(3))
    assert stats.one_sided_p(iv, "lower", bound=0.02) == pytest.approx(_t2_cdf(t_margin), rel=1e-9)
    # "higher than -0.3": t = (-0.25 + 0.3) / se = 1.732, p = 1 - F(1.732) = 0.1127
    assert stats.one_sided_p(iv, "higher", bound=-0.3) == pytest.approx(1 - _t2_cdf(math.sqrt(3)), rel=1e-9)


def test_one_sided_p_needs_two_pairs_and_a_known_direction() -> None:
    assert math.isnan(stats.one_sided_p(stats.interval([-1.0]), "lower"))
    with pytest.raises(ValueError, match=r"direction must be one of \('lower', 'higher'\), got 'below'"):
        stats.one_sided_p(stats.interval([1.0, 2.0]), "below")
    with pytest.raises(ValueError, match="bound must be a finite number"):
        stats.one_sided_p(stats.interval([1.0, 2.0]), "lower", bound=math.nan)


def test_intersection_union_one_failing_baseline_fails_the_claim() -> None:
    passing = {"RMSNorm": 0.001, "LayerNorm": 0.02, "Peri-LN": 0.004}
    claim = stats.intersection_union(passing)
    assert claim.confirmed and claim.verdict == "confirmed" and claim.p == 0.02  # the largest component p
    failing = stats.intersection_union({**passing, "LNS": 0.06})
    assert not failing.confirmed and failing.verdict == "not confirmed"
    assert failing.p == 0.06 and failing.failing == ("LNS",) and failing.missing == ()
    at_alpha = stats.intersection_union({"RMSNorm": 0.05})  # p must be below alpha, not equal to it
    assert at_alpha.failing == ("RMSNorm",) and not at_alpha.confirmed


def test_intersection_union_with_a_missing_component() -> None:
    # LNS has no test (infeasible in the plan): the claim cannot be confirmed, and its p-value is undefined
    untested = stats.intersection_union({"RMSNorm": 0.001, "LNS": None, "DyT": math.nan})
    assert untested.verdict == "untested" and not untested.confirmed and math.isnan(untested.p)
    assert untested.missing == ("LNS", "DyT") and untested.components == ("RMSNorm", "LNS", "DyT")
    both = stats.intersection_union({"RMSNorm": 0.3, "LNS": None})  # a tested component fails: the claim fails
    assert both.verdict == "not confirmed" and both.failing == ("RMSNorm",)
    with pytest.raises(ValueError, match="at least one component"):
        stats.intersection_union({})


def test_geometric_mean_ratio_row_back_transforms_the_ln_interval() -> None:
    # per-seed ratios 2, 4, 8: lns ln2 * (1, 2, 3), mean 2 ln2 (ratio 4), sd ln2, se ln2 / sqrt(3);
    # 95 % interval (t_{0.975, 2} = 4.302653): exp(2 ln2 +- 4.302653 ln2 / sqrt(3)) = 4 exp(-+1.7219) = [0.7149, 22.380]
    row = stats.geometric_mean_ratio([math.log(2), math.log(4), math.log(8)])
    half = 4.302653 * math.log(2) / math.sqrt(3)
    assert row.n == 3 and row.mean == pytest.approx(4.0)
    assert row.low == pytest.approx(math.exp(2 * math.log(2) - half), rel=1e-6)  # 0.7149
    assert row.high == pytest.approx(math.exp(2 * math.log(2) + half), rel=1e-6)  # 22.380
    assert row.low == pytest.approx(0.7149, abs=1e-4) and row.high == pytest.approx(22.380, abs=1e-3)
    assert row.mean == pytest.approx(math.sqrt(row.low * row.high))  # symmetric on the ln scale
    assert (row.minimum, row.maximum) == (pytest.approx(2.0), pytest.approx(8.0))
    assert row.to_dict()["ln_mean"] == pytest.approx(2 * math.log(2)) and row.to_dict()["high"] == row.high


def test_geometric_mean_of_ratios_and_ratio_of_means_can_disagree_in_sign() -> None:
    # one seed dominates both group means: the ratio of means says a < b, every per-seed reading but one a > b
    a, b = {1: 1.0, 2: 1.0, 3: 120.0}, {1: 0.5, 2: 0.5, 3: 400.0}
    lns = stats.paired_ln_ratios(a, b)
    assert lns == pytest.approx([math.log(2), math.log(2), math.log(0.3)])
    ratio_of_means = (122 / 3) / (401 / 3)
    assert math.log(ratio_of_means) < 0 < stats.geometric_mean_ratio(lns).ln.mean  # -1.189 vs +0.061
    assert stats.geometric_mean_ratio(lns).mean == pytest.approx((2 * 2 * 0.3) ** (1 / 3))


def test_geometric_mean_interval_of_a_magnitude_stays_above_zero() -> None:
    # a skewed magnitude over 3 seeds: the arithmetic interval goes below 0, the back-transformed one cannot
    values = [100.0, 1000.0, 10.0]
    assert stats.interval(values).low < 0
    gm = stats.geometric_mean(values)
    assert gm.mean == pytest.approx(100.0) and 0 < gm.low < gm.mean < gm.high  # lns 2, 3, 1 (x ln 10): mean 2 ln 10
    half = 4.302653 * math.log(10) / math.sqrt(3)
    assert gm.low == pytest.approx(100 * math.exp(-half), rel=1e-6)
    assert stats.geometric_mean([100.0, math.nan, 10.0]).n == 2  # a diverged run is left out
    with pytest.raises(ValueError, match="positive values"):
        stats.geometric_mean([1.0, 0.0, 2.0])


def test_paired_ln_ratios_skip_diverged_and_non_positive() -> None:
    a = {1: 2.0, 2: math.nan, 3: 5.0, 4: 0.0}
    b = {1: 1.0, 2: 3.0, 3: 5.0, 4: 1.0, 5: 9.0}
    assert stats.paired_ln_ratios(a, b) == pytest.approx([math.log(2), 0.0])

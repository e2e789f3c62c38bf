"""Seed aggregation of the study: t-intervals, the verdict rules' p-values (directional, non-inferiority, TOST)
and Holm's adjustment against hand computations, and paired differences."""

from __future__ import annotations

import math

import pytest

from bhyt_pl.study import stats


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

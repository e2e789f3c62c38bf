"""What the token-budget map measures (``bhyt_pl.study.protocol.token_budget_effects``), against hand computation and
an independent power integral: the minimum detectable difference, the three arms on a two-seed example, the sign
changes between budgets, the crossover in ln T/P with its interval, and the early-saturation rule's score."""

from __future__ import annotations

import math

import pytest
from scipy import integrate
from scipy import stats as scipy_stats
from study_fixtures import budget_record

from bhyt_pl.study.protocol.stats import interval
from bhyt_pl.study.protocol.token_budget import TokenBudget
from bhyt_pl.study.protocol.token_budget_effects import (
    SATURATION_CUT,
    BudgetEffect,
    budget_effects,
    crossover,
    minimum_detectable_difference,
    saturation_rule,
    sign_changes,
    validation_noise,
)

T_975_2DF = 4.302653  # t_{0.975, 2}: 2 df, F(t) = 1/2 + t / (2 sqrt(2 + t^2))
T_975_1DF = 12.706205  # t_{0.975, 1} = tan(0.475 pi)


def two_sided_power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The two-sided paired t-test's power from its definition, by one integral over the sample variance's
    chi-square (not scipy's noncentral t): E_V[Phi(ncp - c s) + Phi(-ncp - c s)], s = sqrt(V / df)."""
    df, ncp = n - 1, delta * math.sqrt(n) / sd
    c = scipy_stats.t.ppf(1 - alpha / 2, df)

    def integrand(v: float) -> float:
        s = math.sqrt(v / df)
        return (scipy_stats.norm.cdf(ncp - c * s) + scipy_stats.norm.cdf(-ncp - c * s)) * scipy_stats.chi2.pdf(v, df)

    return integrate.quad(integrand, 0, math.inf)[0]


@pytest.mark.parametrize("n", [2, 3, 4, 10])
def test_the_minimum_detectable_difference_has_80_percent_power(n: int) -> None:
    mdd = minimum_detectable_difference(0.165, n)
    assert two_sided_power(mdd, 0.165, n) == pytest.approx(0.8, abs=1e-4)
    # larger than the normal approximation's (z_{0.975} + z_{0.8}) sd / sqrt(n): the t's heavier tails
    assert mdd > (1.959964 + 0.841621) * 0.165 / math.sqrt(n)


def test_the_minimum_detectable_difference_is_undefined_below_two_pairs() -> None:
    assert math.isnan(minimum_detectable_difference(0.1, 1))
    assert math.isnan(minimum_detectable_difference(0.0, 4))


def test_sign_changes_need_intervals_on_both_sides_of_zero() -> None:
    below, above, covering = interval([-0.3, -0.2, -0.25]), interval([0.2, 0.3, 0.25]), interval([-0.5, 0.5, 0.1])
    assert sign_changes([0.01, 0.1, 1.0], [below, covering, above]) == [(0.01, 1.0)]
    assert sign_changes([0.01, 0.1], [below, covering]) == []
    assert sign_changes([0.01, 0.1, 1.0, 10.0], [below, above, above, below]) == [(0.01, 0.1), (1.0, 10.0)]


def _per_seed(intercepts: list[float], slope: float) -> dict[int, dict[float, float]]:
    """Seed i's differences on the line intercepts[i] + slope x at x = ln T/P = 0, 1, 2."""
    return {i: {math.exp(x): a + slope * x for x in (0, 1, 2)} for i, a in enumerate(intercepts)}


def test_the_crossover_and_its_interval_on_synthetic_lines() -> None:
    """Three seeds' lines -0.21 + 0.2x, -0.19 + 0.2x, -0.2 + 0.2x: the mean line crosses at x = 1 (T/P e). The
    intercepts' variance is 1e-4 and the slopes agree, so d(x) covers 0 where |0.2 x - 0.2| <= sqrt(t^2 / 3 x 1e-4),
    t = t_{0.975, 2}: |x - 1| <= 0.124207."""
    c = crossover([1.0, math.e, math.e**2], _per_seed([-0.21, -0.19, -0.2], 0.2))
    half = math.sqrt(T_975_2DF**2 / 3 * 1e-4) / 0.2
    assert half == pytest.approx(0.124207, abs=1e-6)
    assert c.status == "crosses" and c.seeds == 3 and c.slope == pytest.approx(0.2)
    assert c.estimate == pytest.approx(math.e)
    assert c.low == pytest.approx(math.exp(1 - half), rel=1e-6) and c.high == pytest.approx(math.exp(1 + half))
    assert (c.low, c.high) == pytest.approx((2.40078, 3.07777), abs=1e-5)
    assert not (c.open_low or c.open_high)


def test_a_crossing_the_seeds_cannot_place_reaches_the_range_s_ends() -> None:
    """Intercepts -0.3, -0.1, -0.2 (variance 0.01): |x - 1| <= 1.24207 spans all of [0, 2]."""
    c = crossover([1.0, math.e, math.e**2], _per_seed([-0.3, -0.1, -0.2], 0.2))
    assert c.status == "crosses, not located" and c.estimate == pytest.approx(math.e)
    assert (c.low, c.high, c.open_low, c.open_high) == (pytest.approx(1.0), pytest.approx(math.e**2), True, True)


def test_no_sign_change_when_the_mean_line_keeps_its_sign() -> None:
    c = crossover([1.0, math.e, math.e**2], _per_seed([0.4, 0.5, 0.6], 0.01))
    assert c.status == "no sign change" and c.estimate is None
    assert c.low is None and c.high is None  # every seed's line stays above 0: no x where the interval covers it
    assert crossover([1.0, math.e], {0: {1.0: 0.1, math.e: 0.2}}).status == "not enough data"


# ----------------------------------------------------------------------------- the runs of a two-seed example
def test_the_three_arms_loss_difference_and_saturation_on_two_seeds() -> None:
    """BHyT against RMSNorm on one budget, two evaluation seeds, worked by hand:

    - median-token magnitude, ln: BHyT 1 -> 2 (seed 1) and 1 -> 4 (seed 2), RMSNorm 2 -> 4 both. At
      initialisation ln 1 - ln 2 = -0.6931 both seeds; at the end -0.6931 and 0 (mean -0.3466); made by training
      ln 2 - ln 2 = 0 and ln 4 - ln 2 = 0.6931 (mean 0.3466), interval 0.3466 +- t_{0.975, 1} 0.4901 / sqrt 2;
    - validation loss: BHyT 4.0 and 4.2 against 4.1 and 4.1: -0.1 and 0.1, mean 0;
    - saturation at the early step 10: 0.5 and 0.3, mean 0.4;
    - validation noise: per-batch differences (0, 0.2) in seed 1 and (0.1, 0.1) in seed 2: SD/sqrt 2 = 0.1, 0.
    """
    record = budget_record()
    design, runs = record.budgets, record.runs
    [effect] = budget_effects(design, runs)
    assert effect.group == "bhyt" and effect.lr == 3e-3 and effect.per_seed == pytest.approx({1: -0.1, 2: 0.1})
    assert effect.loss.mean == pytest.approx(0.0, abs=1e-12) and effect.loss.n == 2
    median = {a.metric: a for a in effect.arms}["median_magnitude"]
    arms, ln2 = median.phases, math.log(2)
    assert arms.init.mean == pytest.approx(-ln2) and arms.init.low == pytest.approx(-ln2)  # no spread
    assert arms.end.mean == pytest.approx(-ln2 / 2)
    assert arms.training.mean == pytest.approx(ln2 / 2)
    sd = ln2 / math.sqrt(2)  # the differences 0 and ln 2
    assert arms.training.high - arms.training.mean == pytest.approx(T_975_1DF * sd / math.sqrt(2), rel=1e-5)
    assert median.origin == "present at initialisation, unresolved at the end"
    assert effect.saturation_early.mean == pytest.approx(0.4)
    assert effect.saturation_end.mean == pytest.approx(0.4)
    assert effect.gap.mean == pytest.approx(0.1)
    assert effect.val_noise_se == pytest.approx((0.1 + 0.0) / 2)
    assert validation_noise(runs[4], runs[1]) == pytest.approx(0.1)
    assert effect.mdd == pytest.approx(minimum_detectable_difference(effect.loss.sd, 2))


# ----------------------------------------------------------------------------- the saturation rule
def _effect(group: str, ratio: float, early: list[float], loss: list[float]) -> BudgetEffect:
    iv = interval(loss)
    return BudgetEffect(TokenBudget(ratio, 100, 10), group, 1e-3, 1e-3, iv, math.nan, interval([]), (),
                        interval(early), interval(early), math.nan, dict(enumerate(loss, 1)))  # fmt: skip


def test_the_saturation_rule_scored_on_a_synthetic_table() -> None:
    """Early saturation >= 0.36 predicts a lower loss. Cells: 0.5 with -0.2 (decided): right; 0.5 with +0.05
    (undecided): wrong; 0.1 with +0.3 (decided): right; 0.2 with -0.05 (undecided): wrong; a scheme without a
    bounded site (no saturation) is not a cell. Accuracy 2 of 4; 2 of 2 over the decided cells."""
    assert SATURATION_CUT == 0.36
    effects = [
        _effect("dyt", 0.015, [0.5, 0.5, 0.5], [-0.21, -0.2, -0.19]),
        _effect("dyt", 1.0, [0.5, 0.5, 0.5], [0.3, -0.2, 0.05]),
        _effect("bhyt", 0.015, [0.1, 0.1, 0.1], [0.29, 0.3, 0.31]),
        _effect("bhyt", 1.0, [0.2, 0.2, 0.2], [-0.3, 0.25, -0.1]),
        _effect("layernorm", 1.0, [math.nan] * 3, [0.1, 0.2, 0.3]),
    ]
    rule = saturation_rule(effects)
    assert len(rule.cells) == 4
    assert [c.correct for c in rule.cells] == [True, False, True, False]
    assert [c.decided for c in rule.cells] == [True, False, True, False]
    assert rule.accuracy == 0.5 and rule.decided_accuracy == 1.0
    assert [(c.group, c.budget.ratio) for c in rule.wrong] == [("dyt", 1.0), ("bhyt", 1.0)]
    # the cut is the rule's, not fitted: moving it to 0.6 turns both dyt predictions to "higher"
    moved = saturation_rule(effects, cut=0.6)
    assert [c.correct for c in moved.cells] == [False, True, True, False]
    assert rule.cells[0].predicted == -1 and rule.cells[2].predicted == 1

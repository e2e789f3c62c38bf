"""The confirmation's verdicts (``bhyt_pl.study.protocol.confirmation``) on a synthetic pilot's plan and runs whose
per-seed differences are set by hand: verdicts that read only the confirmation's seeds, one-sided p-values against
scipy's paired t-test, Holm by hand, an intersection-union claim that one failing baseline fails, a test without
pairs, and each rule's p-value by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scipy import stats as scipy_stats
from study_fixtures import confirmation_ln, confirmation_runs, layer_run, pilot_spec

from bhyt_pl.study.protocol import power_plan, stats
from bhyt_pl.study.protocol.confirmation import evaluate, family_runs, p_value

MEDIAN = "BHyT < {}: median_magnitude"


def test_verdicts_read_only_the_confirmations_seeds(pilot, plan: power_plan.Plan) -> None:
    runs = confirmation_runs(plan, pilot)
    # the pilot's own runs of the same groups, candidates and rate, with values that would flip every verdict
    pilot_runs = [
        layer_run(pilot_spec(g, i), 9.0 if g == "bhyt" else -9.0) for g in plan.group_seeds for i in (1, 2, 3)
    ]
    assert set(family_runs(plan, runs + pilot_runs, "bhyt")) == set(range(4, 9))
    assert evaluate(plan, runs + pilot_runs) == evaluate(plan, runs)
    # another rate or candidate is not the plan's either
    other = [replace(r, spec=replace(r.spec, lr=1e-2, label=r.spec.label + "x")) for r in runs]
    assert family_runs(plan, other, "bhyt") == {}


def test_one_sided_p_values_match_scipys_paired_t_test_and_holm_runs_by_hand(pilot, plan: power_plan.Plan) -> None:
    evaluation = evaluate(plan, confirmation_runs(plan, pilot), tokens_per_step=64)
    seeds = range(4, 9)
    for t in evaluation.tests:
        target, baseline = (
            (confirmation_ln(t.planned.target, i) for i in seeds),
            (confirmation_ln(t.planned.baseline, i) for i in seeds),
        )
        a, b = list(target), list(baseline)
        if t.planned.statistic in ("variance", "variance_growth"):
            a, b = [2 * x for x in a], [2 * x for x in b]  # ln of the square
        reference = scipy_stats.ttest_rel(a, b, alternative="less").pvalue
        assert t.p == pytest.approx(reference, rel=1e-9), t.planned.name
        assert t.target_runs == tuple(f"{t.planned.target}@lr0.003-steps10-s{i}" for i in seeds)
    # Holm by hand: the i-th smallest of m p-values times (m - i), running maximum, capped at 1
    ordered = sorted(evaluation.tests, key=lambda t: t.p)
    running, m = 0.0, len(ordered)
    for rank, t in enumerate(ordered):
        running = max(running, min(1.0, (m - rank) * t.p))
        assert t.holm_p == pytest.approx(running)
        assert t.verdict == (stats.CONFIRMED if running < 0.05 else stats.NOT_CONFIRMED)
    assert evaluation.test(MEDIAN.format("RMSNorm")).verdict == stats.CONFIRMED
    assert evaluation.test(MEDIAN.format("Peri-LN")).verdict == stats.NOT_CONFIRMED
    # over training (the fixtures' trajectories record magnitude and variance): step 0, all ones, and the end
    variance = evaluation.test("BHyT < RMSNorm: variance")
    assert [p["step"] for p in variance.over_training] == [0, 10]
    assert variance.over_training[0]["mean"] == 0.0 and variance.over_training[-1]["p_one_sided"] == pytest.approx(
        variance.p
    )


def test_one_failing_baseline_fails_the_paper_level_claim(pilot, plan: power_plan.Plan) -> None:
    (claim,) = evaluate(plan, confirmation_runs(plan, pilot)).claims
    evaluation = evaluate(plan, confirmation_runs(plan, pilot))
    components = [evaluation.test(MEDIAN.format(b)) for b in ("RMSNorm", "LayerNorm", "Peri-LN")]
    assert [c.verdict for c in components] == [stats.CONFIRMED, stats.CONFIRMED, stats.NOT_CONFIRMED]
    assert claim.planned.primary and claim.verdict == stats.NOT_CONFIRMED
    assert claim.iut.failing == (MEDIAN.format("Peri-LN"),) and claim.iut.missing == ()
    assert claim.iut.p == max(c.holm_p for c in components)
    # with BHyT below Peri-LN too, every component passes and so does the claim
    below = [
        replace(r, depth_final=layer_run(r.spec, confirmation_ln("peri_ln", r.spec.seed_index) + 1.0).depth_final)
        if r.spec.group == "peri_ln"
        else r
        for r in confirmation_runs(plan, pilot)
    ]
    (claim,) = evaluate(plan, below).claims
    assert claim.verdict == stats.CONFIRMED and claim.iut.p < 0.05


def test_a_test_without_pairs_is_untested_and_so_is_its_claim(pilot, plan: power_plan.Plan) -> None:
    runs = [r for r in confirmation_runs(plan, pilot) if r.spec.group != "peri_ln"]
    evaluation = evaluate(plan, runs)
    assert evaluation.test(MEDIAN.format("Peri-LN")).verdict == stats.UNTESTED
    (claim,) = evaluation.claims
    assert claim.verdict == stats.UNTESTED and claim.iut.missing == (MEDIAN.format("Peri-LN"),)


def test_test_p_by_rule_against_hand_computation() -> None:
    d = stats.interval([-0.3, -0.1, -0.2])  # mean -0.2, se 0.1 / sqrt(3)
    t = -0.2 / (0.1 / math.sqrt(3))
    assert p_value(d, "lower") == pytest.approx(scipy_stats.t.cdf(t, 2))
    assert p_value(d, "higher") == pytest.approx(scipy_stats.t.sf(t, 2))
    # no worse than +0.1: t against the margin
    assert p_value(d, "no_worse", 0.1) == pytest.approx(scipy_stats.t.cdf((-0.2 - 0.1) / (0.1 / math.sqrt(3)), 2))
    # TOST within +-0.25: the larger of P(T >= (m + 0.25) / se) and P(T <= (m - 0.25) / se)
    se = 0.1 / math.sqrt(3)
    tost = max(scipy_stats.t.sf((-0.2 + 0.25) / se, 2), scipy_stats.t.cdf((-0.2 - 0.25) / se, 2))
    assert p_value(d, "equivalent", 0.25) == pytest.approx(tost)
    assert math.isnan(p_value(stats.interval([1.0]), "lower"))
    with pytest.raises(ValueError, match="rule must be one of"):
        p_value(d, "smaller")

"""Seed aggregation of the study: t-intervals against a hand computation, paired differences, the verdict
rules, and the first-seed learning-rate choice."""

from __future__ import annotations

import math

import pytest

from bhyt_pl.study import stats
from bhyt_pl.study.plan import choose, parse_group, seed_specs, selection_specs
from bhyt_pl.study.runner import RunResult, RunSpec


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


def _iv(low: float, high: float) -> stats.Interval:
    return stats.Interval(3, (low + high) / 2, low, high, low, high)


@pytest.mark.parametrize(
    ("low", "high", "sign", "label"),
    [
        (-0.3, -0.1, -1, "reproduced"),
        (0.1, 0.3, -1, "not reproduced"),
        (-0.1, 0.1, -1, "inconclusive"),
        (0.1, 0.3, 1, "reproduced"),
    ],
)
def test_direction_rule(low: float, high: float, sign: int, label: str) -> None:
    assert stats.verdict_direction(_iv(low, high), sign).label == label


@pytest.mark.parametrize(
    ("low", "high", "label"),
    [(-0.2, 0.019, "reproduced"), (0.021, 0.1, "not reproduced"), (-0.1, 0.05, "inconclusive")],
)
def test_no_worse_rule_uses_the_upper_bound_and_a_002_margin(low: float, high: float, label: str) -> None:
    assert stats.verdict_no_worse(_iv(low, high)).label == label


@pytest.mark.parametrize(
    ("low", "high", "label"),
    [
        (-0.04, 0.049, "reproduced"),
        (0.06, 0.2, "not reproduced"),
        (-0.2, -0.051, "not reproduced"),
        (0.0, 0.1, "inconclusive"),
    ],
)
def test_approx_rule_within_005(low: float, high: float, label: str) -> None:
    assert stats.verdict_approx(_iv(low, high)).label == label


def test_undefined_interval_is_inconclusive() -> None:
    one = stats.interval([0.5])
    for verdict in (stats.verdict_direction(one, -1), stats.verdict_no_worse(one), stats.verdict_approx(one)):
        assert verdict.label == "inconclusive"


def test_lr_selection_picks_lowest_validation_loss_and_skips_diverged() -> None:
    group = parse_group("dyt:alpha_attn=0.5|1.0")
    assert [v.norm_args for v in group.candidates] == [{"alpha_attn": 0.5}, {"alpha_attn": 1.0}]
    base = RunSpec(label="base", norm="rmsnorm", seed=42, data_seed=7)
    specs = selection_specs(group, [1e-3, 1e-2], base)
    assert [s.label for s in specs] == [
        "dyt:alpha_attn=0.5@lr0.001-s0",
        "dyt:alpha_attn=0.5@lr0.01-s0",
        "dyt:alpha_attn=1.0@lr0.001-s0",
        "dyt:alpha_attn=1.0@lr0.01-s0",
    ]
    losses = [5.0, 4.0, 4.5, math.nan]
    results = [RunResult(spec=s, val_loss=v) for s, v in zip(specs, losses, strict=True)]
    results[3].status = "diverged"
    results[1].status = "diverged"  # the lowest loss, but diverged: not eligible
    winner = choose(results)
    assert winner.spec.label == "dyt:alpha_attn=1.0@lr0.001-s0"
    rest = seed_specs(group, winner, 3, base)
    assert [(s.label, s.lr, s.seed, s.data_seed) for s in rest] == [
        ("dyt:alpha_attn=1.0@lr0.001-s1", 1e-3, 43, 8),
        ("dyt:alpha_attn=1.0@lr0.001-s2", 1e-3, 44, 9),
    ]


def test_lr_selection_ties_keep_the_first() -> None:
    group = parse_group("rmsnorm")
    specs = selection_specs(group, [1e-3, 3e-3], RunSpec(label="b", norm="rmsnorm"))
    assert choose([RunResult(spec=s, val_loss=4.0) for s in specs]).spec.lr == 1e-3


def test_every_registered_scheme_parses_as_a_group() -> None:
    from bhyt_pl.norms import registered_norms

    for name in registered_norms():
        group = parse_group(name)
        assert group.norm == name and len(group.candidates) == 1


def test_bad_grid_option_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be key=value"):
        parse_group("bhyt:lambda_attn")
    with pytest.raises(ValueError, match="unknown scheme"):
        parse_group("nonorm")


def test_seeds_needed_for_a_decisive_interval() -> None:
    # mean -0.1, sd 0.2 (from 3 values): n seeds give half-width t_{n-1} * 0.2 / sqrt(n) < 0.1 first at n = 18
    iv = stats.interval([-0.3, -0.1, 0.1])
    assert iv.sd == pytest.approx(0.2)
    assert stats.seeds_needed(iv, room=0.1) == 18  # t_16 = 2.120: 2.120 * 0.2 / sqrt(17) = 0.1028 >= 0.1
    assert stats.seeds_needed(iv, room=-0.1) is None  # the mean is on the wrong side

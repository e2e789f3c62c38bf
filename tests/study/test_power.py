"""Sample-size mathematics (``bhyt_pl.study.protocol.power``) against hand computations (``power_reference``'s
hand-worked pilot), the power by numerical integration (not scipy's noncentral t), and simulations with fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from power_reference import EFFECT, PILOT, SD, reference_power
from scipy import stats as scipy_stats

from bhyt_pl.study.protocol import power


def test_shrunk_effect_and_inflated_sd_by_hand() -> None:
    assert power.shrunk_effect(PILOT, "lower") == pytest.approx(0.195567, abs=1e-6)
    assert power.shrunk_effect(PILOT, "higher") == pytest.approx(-0.304433, abs=1e-6)  # the wrong side: infeasible
    # no worse than +0.1: the distance from the margin to the upper bound, 0.1 + 0.195567
    assert power.shrunk_effect(PILOT, "no_worse", margin=0.1) == pytest.approx(0.295567, abs=1e-6)
    # equivalent within 0.4: the room the bound farther from 0 leaves, 0.4 - 0.304433
    assert power.shrunk_effect(PILOT, "equivalent", margin=0.4) == pytest.approx(0.095567, abs=1e-6)
    assert power.inflated_sd(0.05, 3) == pytest.approx(0.105847, abs=1e-6)
    assert power.inflated_sd(1.0, 3) == pytest.approx(2.1169, abs=1e-4)  # "2.12 s for 3 pairs"
    assert math.isnan(power.shrunk_effect([-1.0], "lower")) and math.isnan(power.inflated_sd(1.0, 1))


def test_power_matches_the_integral_and_a_simulation() -> None:
    for n, level in ((3, 0.05), (5, 0.025), (9, 0.00625)):
        assert power.power_at(n, EFFECT, SD, level) == pytest.approx(reference_power(EFFECT, SD, n, level), abs=1e-6)
    # simulation: 20,000 studies of 5 pairs, true mean -EFFECT, true SD SD, one-sided t-test at 0.025
    rng = np.random.default_rng(0)
    d = rng.normal(-EFFECT, SD, size=(20_000, 5))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(5))
    rejected = float(np.mean(t <= scipy_stats.t.ppf(0.025, 4)))
    assert rejected == pytest.approx(power.power_at(5, EFFECT, SD, 0.025), abs=0.012)  # 3 binomial SEs
    assert power.power_at(5, -EFFECT, SD, 0.025) == 0.0  # the claim's side is not reached


def test_equivalence_power_matches_a_simulation() -> None:
    # TOST within +-0.2, SD 0.2, 8 pairs, both one-sided tests at 0.05; the true difference 0 (room 0.2: both
    # tails of the acceptance region matter) and 0.05 (room 0.15)
    rng = np.random.default_rng(1)
    c = scipy_stats.t.ppf(0.95, 7)
    for true, room in ((0.0, 0.2), (0.05, 0.15)):
        d = rng.normal(true, 0.2, size=(20_000, 8))
        se = d.std(axis=1, ddof=1) / math.sqrt(8)
        both = ((d.mean(axis=1) + 0.2) / se >= c) & ((0.2 - d.mean(axis=1)) / se >= c)
        expected = power.power_at(8, room, 0.2, 0.05, rule="equivalent", margin=0.2)
        assert float(np.mean(both)) == pytest.approx(expected, abs=0.012)  # 3 binomial SEs
        assert 0.4 < expected < 0.7  # 0.635 and 0.53: where the integral's shape matters


def test_confirmation_seeds_sit_above_every_pilot_seed() -> None:
    assert power.confirmation_seed_indices([0, 1, 2, 3], 5) == range(4, 9)
    assert power.confirmation_seed_indices([3, 0, 7, 1], 2) == range(8, 10)  # above the largest, not the count
    with pytest.raises(ValueError, match="pilot_indices is empty"):
        power.confirmation_seed_indices([], 3)


def test_seeds_for_power_search() -> None:
    assert power.seeds_for_power(lambda n: n / 100, target=0.8, minimum=3, limit=1000) == 80
    assert power.seeds_for_power(lambda n: 0.9, minimum=3) == 3
    assert power.seeds_for_power(lambda n: n / 10_000, limit=1000) is None  # 0.1 at the limit


def test_bad_inputs_raise_naming_the_value() -> None:
    with pytest.raises(ValueError, match="n must be >= 2 pairs"):
        power.power_at(1, EFFECT, SD, 0.05)
    with pytest.raises(ValueError, match="rule must be one of"):
        power.shrunk_effect(PILOT, "smaller")

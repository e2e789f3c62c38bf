"""Seed statistics of the study: means with 95 % t-intervals, seed-paired differences and the verdict rules.

A study runs every scheme once per seed; seed ``i`` of two schemes shares the initialisation seed and
the data order, so the claims compare schemes through the *paired* differences ``a_i - b_i`` (the
seed-to-seed variation common to both cancels). With ``n`` pairs the 95 % interval is
``mean +- t_{0.975, n-1} * sd / sqrt(n)`` (``sd`` with ``n - 1`` degrees of freedom); fewer than two
finite values give no interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy_stats

__all__ = [
    "seeds_needed",
    "Interval",
    "Verdict",
    "interval",
    "paired_differences",
    "verdict_approx",
    "verdict_direction",
    "verdict_no_worse",
]

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


@dataclass(frozen=True)
class Interval:
    """Mean, 95 % t-interval and min-max of ``n`` finite values (NaN bounds when ``n < 2``)."""

    n: int
    mean: float
    low: float
    high: float
    minimum: float
    maximum: float

    @property
    def defined(self) -> bool:
        return self.n >= 2 and math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def sd(self) -> float:
        """The sample standard deviation the interval was built from (NaN when undefined)."""
        if not self.defined:
            return math.nan
        return (self.high - self.mean) * math.sqrt(self.n) / float(_scipy_stats.t.ppf(0.975, self.n - 1))


def interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The ``confidence`` t-interval of the mean of the finite ``values`` (non-finite ones are left out)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = sum(finite) / n
    if n < 2:
        return Interval(n, mean, math.nan, math.nan, min(finite), max(finite))
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1))
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half, min(finite), max(finite))


def paired_differences(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """``a[s] - b[s]`` for every seed ``s`` both have with finite values (a diverged run has no pair)."""
    return [
        a[s] - b[s]
        for s in sorted(set(a) & set(b))
        if a[s] is not None and b[s] is not None and math.isfinite(a[s]) and math.isfinite(b[s])
    ]


@dataclass(frozen=True)
class Verdict:
    """The verdict on one claim and the rule that produced it."""

    label: str
    rule: str


def verdict_direction(diff: Interval, expected_sign: int) -> Verdict:
    """``expected_sign`` -1: the paper says the difference is negative. Reproduced when the interval excludes
    0 on that side, not reproduced when it excludes 0 on the other, else inconclusive."""
    rule = f"95% CI of the paired difference {'< 0' if expected_sign < 0 else '> 0'}"
    if not diff.defined:
        return Verdict(INCONCLUSIVE, rule + f" (only {diff.n} finite pairs)")
    low, high = (diff.low, diff.high) if expected_sign > 0 else (-diff.high, -diff.low)
    if low > 0:
        return Verdict(REPRODUCED, rule)
    if high < 0:
        return Verdict(NOT_REPRODUCED, rule)
    return Verdict(INCONCLUSIVE, rule + " (the CI contains 0)")


def verdict_no_worse(diff: Interval, margin: float = 0.02) -> Verdict:
    """ "A no worse than B" on ``diff = A - B`` (lower is better): reproduced when the upper bound is below
    ``+margin``, not reproduced when the lower bound is above it, else inconclusive."""
    rule = f"upper 95% bound of the paired difference < +{margin:g}"
    if not diff.defined:
        return Verdict(INCONCLUSIVE, rule + f" (only {diff.n} finite pairs)")
    if diff.high < margin:
        return Verdict(REPRODUCED, rule)
    if diff.low > margin:
        return Verdict(NOT_REPRODUCED, rule)
    return Verdict(INCONCLUSIVE, rule + " (the CI straddles the margin)")


def verdict_approx(diff: Interval, margin: float = 0.05) -> Verdict:
    """ "A ~ B": reproduced when the whole interval lies within ``+-margin``, not reproduced when it lies
    entirely outside, else inconclusive."""
    rule = f"95% CI of the paired difference within +-{margin:g}"
    if not diff.defined:
        return Verdict(INCONCLUSIVE, rule + f" (only {diff.n} finite pairs)")
    if -margin < diff.low and diff.high < margin:
        return Verdict(REPRODUCED, rule)
    if diff.low > margin or diff.high < -margin:
        return Verdict(NOT_REPRODUCED, rule)
    return Verdict(INCONCLUSIVE, rule + " (the CI crosses the margin)")


def seeds_needed(diff: Interval, room: float, limit: int = 1000) -> int | None:
    """Seeds a decisive 95 % interval would take if the mean and the spread stayed as measured: the smallest
    ``n`` with ``t_{0.975, n-1} * sd / sqrt(n) < room`` (``room``: distance from the mean to the decision
    boundary). None when the mean sits on the wrong side (``room <= 0``), the spread is undefined, or
    more than ``limit`` would be needed."""
    sd = diff.sd
    if not room > 0 or not math.isfinite(sd):
        return None
    for n in range(2, limit + 1):
        if float(_scipy_stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) < room:
            return n
    return None

"""Seed statistics of the study: means with t-intervals, seed-paired differences, the verdict rules as
p-values (directional, non-inferiority, TOST equivalence) and Holm's adjustment over a family of claims.

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
    "ALPHA",
    "DEPENDS",
    "RULES",
    "Interval",
    "combine",
    "holm",
    "interval",
    "label_from_p",
    "rule_p_values",
    "seeds_needed",
    "paired_differences",
]

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
DEPENDS = "depends on the learning rate"
ALPHA = 0.05
"""Level of every test: a claim is reproduced when its p-value for the paper's side is below ``ALPHA``."""
RULES = ("lower", "higher", "no_worse", "equivalent")
"""Verdict rules of a claim on ``d = target - baseline`` (docs/method.md, section 10)."""


@dataclass(frozen=True)
class Interval:
    """Mean, ``confidence`` t-interval (95 % unless told) and min-max of ``n`` finite values (NaN bounds when
    ``n < 2``)."""

    n: int
    mean: float
    low: float
    high: float
    minimum: float
    maximum: float
    confidence: float = 0.95

    @property
    def defined(self) -> bool:
        return self.n >= 2 and math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def se(self) -> float:
        """Standard error of the mean (NaN when undefined); from the interval, whatever its confidence."""
        return self.sd / math.sqrt(self.n) if self.defined else math.nan

    @property
    def sd(self) -> float:
        """The sample standard deviation the interval was built from (NaN when undefined)."""
        if not self.defined:
            return math.nan
        t = float(_scipy_stats.t.ppf(0.5 + self.confidence / 2, self.n - 1))
        return (self.high - self.mean) * math.sqrt(self.n) / t


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
    return Interval(n, mean, mean - half, mean + half, min(finite), max(finite), confidence)


def paired_differences(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """``a[s] - b[s]`` for every seed ``s`` both have with finite values (a diverged run has no pair)."""
    return [
        a[s] - b[s]
        for s in sorted(set(a) & set(b))
        if a[s] is not None and b[s] is not None and math.isfinite(a[s]) and math.isfinite(b[s])
    ]


def seeds_needed(diff: Interval, room: float, limit: int = 1000, confidence: float = 0.95) -> int | None:
    """Seeds a decisive interval at ``confidence`` would take if the mean and the spread stayed as measured: the
    smallest ``n`` with ``t_{q, n-1} * sd / sqrt(n) < room``, ``q = 1 - (1 - confidence) / 2`` (0.975 for the
    95 % interval of ``lower`` and ``no worse``; 0.95 for the 90 % interval of a TOST, ``confidence=0.90``);
    ``room``: distance from the mean to the decision boundary. None when the mean sits on the wrong side
    (``room <= 0``), the spread is undefined, or more than ``limit`` would be needed."""
    sd = diff.sd
    if not room > 0 or not math.isfinite(sd):
        return None
    q = 1 - (1 - confidence) / 2
    for n in range(2, limit + 1):
        if float(_scipy_stats.t.ppf(q, n - 1)) * sd / math.sqrt(n) < room:
            return n
    return None


def _t_sf(mean: float, se: float, at: float, n: int) -> float:
    """One-sided p-value ``P(T >= (mean - at) / se)`` of a t-test with ``n - 1`` degrees of freedom."""
    if se == 0:
        return 0.0 if mean > at else (1.0 if mean < at else 0.5)
    return float(_scipy_stats.t.sf((mean - at) / se, n - 1))


def rule_p_values(diff: Interval, rule: str, margin: float = 0.0) -> tuple[float, float]:
    """``(p_for, p_against)`` of a claim on the paired difference ``d = target - baseline``: the claim is
    reproduced when ``p_for < ALPHA`` and not reproduced when ``p_against < ALPHA`` (NaN: fewer than 2 pairs).

    - ``lower`` (the paper: ``d < 0``) / ``higher``: two-sided t-test of ``d = 0``, split by side; p_for < 0.05
      exactly when the 95 % interval excludes 0 on the paper's side, p_against when it does on the other.
    - ``no_worse`` (``d < margin``, lower is better): the same about ``margin`` instead of 0 (the upper 95 %
      bound below ``+margin``; against: the lower bound above it).
    - ``equivalent`` (``|d| < margin``, TOST): p_for is the larger of the two one-sided p-values of
      ``d <= -margin`` and ``d >= +margin``, below 0.05 exactly when the 90 % interval lies inside
      ``+-margin``; p_against (twice the smaller one-sided p of ``d`` beyond a margin) when the 95 %
      interval lies wholly outside it.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if rule in ("no_worse", "equivalent") and not margin > 0:
        raise ValueError(f"rule {rule!r} needs a margin > 0, got {margin}")
    if not diff.defined:
        return math.nan, math.nan
    se, n, m = diff.se, diff.n, diff.mean
    if rule in ("lower", "higher", "no_worse"):
        at = margin if rule == "no_worse" else 0.0
        above = _t_sf(m, se, at, n)  # P(T >= t): small when d is clearly above ``at``
        below = _t_sf(-m, se, -at, n)  # small when d is clearly below ``at``
        p_for, p_against = (above, below) if rule == "higher" else (below, above)
        return min(1.0, 2 * p_for), min(1.0, 2 * p_against)
    above_low = _t_sf(m, se, -margin, n)  # H0: d <= -margin
    below_high = _t_sf(-m, se, -margin, n)  # H0: d >= +margin
    p_for = max(above_low, below_high)
    outside = min(_t_sf(m, se, margin, n), _t_sf(-m, se, margin, n))  # d > +margin or d < -margin
    return p_for, min(1.0, 2 * outside)


def label_from_p(p_for: float, p_against: float, alpha: float = ALPHA) -> str:
    """The verdict of one test from its two p-values (NaN: inconclusive)."""
    if math.isfinite(p_for) and p_for < alpha:
        return REPRODUCED
    if math.isfinite(p_against) and p_against < alpha:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def combine(labels: Sequence[str]) -> str:
    """One verdict over several learning rates: the common verdict, else "depends on the learning rate"."""
    if not labels:
        return INCONCLUSIVE
    return labels[0] if all(label == labels[0] for label in labels) else DEPENDS


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over the whole family); NaN entries
    stay NaN and are not counted in the family. Adjusted ``p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``
    over the ``m`` finite p-values sorted ascending."""
    finite = sorted((p, i) for i, p in enumerate(p_values) if p is not None and math.isfinite(p))
    m = len(finite)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted

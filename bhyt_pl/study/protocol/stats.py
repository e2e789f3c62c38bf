"""Seed statistics of the study: means with t-intervals, seed-paired differences, the verdict rules as
p-values (directional, non-inferiority, TOST equivalence) and Holm's adjustment over a family of claims.

A study runs every scheme once per seed; seed ``i`` of two schemes shares the initialisation seed and
the data order, so the claims compare schemes through the *paired* differences ``a_i - b_i`` (the
seed-to-seed variation common to both cancels). With ``n`` pairs the 95 % interval is
``mean +- t_{0.975, n-1} * sd / sqrt(n)`` (``sd`` with ``n - 1`` degrees of freedom); fewer than two
finite values give no interval.

The confirmation stage (docs/method.md, section 10, "Confirmation") adds one-sided tests in a stated direction
(``one_sided_p``), paper-level claims as intersection-union tests over their baselines (``intersection_union``)
and geometric means of positive quantities with intervals back-transformed from the ln scale
(``geometric_mean``, ``geometric_mean_ratio``), so that no interval on a magnitude or a variance goes below 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as _scipy_stats

__all__ = [
    "ALPHA",
    "CONFIRMED",
    "DEPENDS",
    "DIRECTIONS",
    "NOT_CONFIRMED",
    "RULES",
    "UNTESTED",
    "GeometricMean",
    "Interval",
    "IntersectionUnion",
    "combine",
    "geometric_mean",
    "geometric_mean_ratio",
    "holm",
    "intersection_union",
    "interval",
    "label_from_p",
    "one_sided_p",
    "paired_ln_ratios",
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
DIRECTIONS = ("lower", "higher")
"""Sides of a one-sided test: the claim says ``d`` lies below (``lower``) or above (``higher``) a bound."""
CONFIRMED, NOT_CONFIRMED, UNTESTED = "confirmed", "not confirmed", "untested"


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


def one_sided_p(diff: Interval, direction: str, bound: float = 0.0) -> float:
    """p-value of the one-sided paired t-test of the claim ``mean d < bound`` (``lower``) or ``mean d > bound``
    (``higher``), ``t = (mean - bound) / (sd / sqrt(n))`` with ``n - 1`` degrees of freedom: ``P(T <= t)`` for
    ``lower``, ``P(T >= t)`` for ``higher``. NaN with fewer than 2 pairs.

    The confirmation's verdicts are these one-sided p-values, declared before its runs (docs/method.md, section
    10); the exploration's ``rule_p_values`` doubles them (a two-sided test split by side). ``bound`` is the
    margin of a non-inferiority test (``lower`` against ``+margin``: "no worse").
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not math.isfinite(bound):
        raise ValueError(f"bound must be a finite number, got {bound!r}")
    if not diff.defined:
        return math.nan
    if direction == "higher":
        return _t_sf(diff.mean, diff.se, bound, diff.n)
    return _t_sf(-diff.mean, diff.se, -bound, diff.n)


@dataclass(frozen=True)
class IntersectionUnion:
    """An intersection-union test: the claim holds only if every component's claim does.

    Args:
        p: the largest component p-value (NaN when a component has none).
        components: the component names, in the order given.
        failing: the components whose p-value is not below ``alpha``.
        missing: the components without a p-value (infeasible, dropped from the plan, or not run).
        alpha: the level every component is read at.
    """

    p: float
    components: tuple[str, ...]
    failing: tuple[str, ...]
    missing: tuple[str, ...]
    alpha: float = ALPHA

    @property
    def confirmed(self) -> bool:
        return not self.missing and not self.failing

    @property
    def verdict(self) -> str:
        """``confirmed``; ``not confirmed`` when a component that was tested fails (whatever is missing: the
        claim cannot hold); ``untested`` when every tested component passes but some component has no test."""
        if self.failing:
            return NOT_CONFIRMED
        return UNTESTED if self.missing else CONFIRMED


def intersection_union(p_values: Mapping[str, float | None], alpha: float = ALPHA) -> IntersectionUnion:
    """Combine the components of a paper-level claim such as "BHyT has the lowest X" (one component per baseline).

    The claim's null hypothesis is the union of the components' nulls (some baseline is not beaten), so the test
    rejects it only when every component rejects its own, each at level ``alpha``; its p-value is the largest
    component p-value (Berger 1982: no further multiplicity correction is needed for the claim itself). Pass the
    p-values the components are judged by (Holm-adjusted ones when the components belong to a Holm family).
    ``None`` or NaN marks a component without a test: the claim is then not confirmed and its p-value is NaN.
    """
    if not p_values:
        raise ValueError("intersection_union needs at least one component p-value, got none")
    missing = tuple(name for name, p in p_values.items() if p is None or not math.isfinite(p))
    present = {name: float(p) for name, p in p_values.items() if name not in missing}
    failing = tuple(name for name, p in present.items() if not p < alpha)
    p = math.nan if missing else max(present.values())
    return IntersectionUnion(p, tuple(p_values), failing, missing, alpha)


@dataclass(frozen=True)
class GeometricMean:
    """Geometric mean of positive quantities with its t-interval, computed on the ln scale and back-transformed
    (``exp``): the bounds are positive and multiplicative around the mean. ``ln`` holds the ln-scale interval."""

    ln: Interval

    @property
    def n(self) -> int:
        return self.ln.n

    @property
    def confidence(self) -> float:
        return self.ln.confidence

    @property
    def defined(self) -> bool:
        return self.ln.defined

    @property
    def mean(self) -> float:
        return _exp(self.ln.mean)

    @property
    def low(self) -> float:
        return _exp(self.ln.low)

    @property
    def high(self) -> float:
        return _exp(self.ln.high)

    @property
    def minimum(self) -> float:
        return _exp(self.ln.minimum)

    @property
    def maximum(self) -> float:
        return _exp(self.ln.maximum)

    def to_dict(self) -> dict[str, float | int]:
        """The back-transformed values and the ln-scale mean and bounds (what a JSON record needs)."""
        return {
            "n": self.n,
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "confidence": self.confidence,
            "ln_mean": self.ln.mean,
            "ln_low": self.ln.low,
            "ln_high": self.ln.high,
        }


def _exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) else math.nan


def geometric_mean_ratio(ln_ratios: Sequence[float], confidence: float = 0.95) -> GeometricMean:
    """The geometric mean of per-seed ratios ``a_s / b_s`` from their lns ``ln a_s - ln b_s``, with the
    ``confidence`` t-interval of the mean ln back-transformed: the table beside a test on ln ratios shows the
    number the test is about. A ratio of group means (``mean a / mean b``) answers another question and can
    disagree with it, even in sign on the ln scale, when one seed dominates a group mean."""
    return GeometricMean(interval(ln_ratios, confidence))


def geometric_mean(values: Sequence[float], confidence: float = 0.95) -> GeometricMean:
    """The geometric mean of a positive per-run statistic (a magnitude, a variance) over seeds, with its
    back-transformed ``confidence`` t-interval, which never goes below 0 as an arithmetic interval over a few
    seeds of a skewed statistic can. Non-finite values (a diverged run) are left out; a value <= 0 is an error."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    bad = [v for v in finite if v <= 0]
    if bad:
        raise ValueError(f"geometric_mean needs positive values (a magnitude or a variance), got {bad}")
    return GeometricMean(interval([math.log(v) for v in finite], confidence))


def paired_ln_ratios(a: Mapping[int, float], b: Mapping[int, float]) -> list[float]:
    """``ln(a[s] / b[s])`` for every seed both have with finite positive values (``paired_differences`` of the
    lns), the per-seed scale of the tests on magnitudes and variances."""

    def ln(values: Mapping[int, float]) -> dict[int, float]:
        return {s: math.log(v) if v is not None and math.isfinite(v) and v > 0 else math.nan for s, v in values.items()}

    return paired_differences(ln(a), ln(b))

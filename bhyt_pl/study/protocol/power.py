"""Sample sizes for the confirmation from a pilot's per-seed paired differences: the effect shrunk and the SD
inflated to what the pilot can vouch for, the power of a one-sided paired t-test and of an equivalence test (TOST),
the smallest seed count reaching a power, and seed indices above the pilot's.

For a test on the paired difference ``d = target - baseline`` (on the test's scale: ln ratios for last-layer
magnitudes and variances, growth as it is; docs/method.md, section 10, "Confirmation"):

1. **Effect, shrunk.** The pilot's mean of 3 pairs is optimistic for the tests that look best, so the plan uses
   the bound of the pilot's two-sided 80 % t-interval nearer the decision boundary (0, or the margin), measured
   from that boundary on the claim's side (``shrunk_effect``). A test whose 80 % interval reaches the boundary or
   the wrong side is *infeasible*: no seed count can be planned from it.
2. **SD, inflated** to its one-sided 80 % upper confidence bound, ``s * sqrt((n - 1) / chi2_{0.20, n-1})``
   (2.12 s for 3 pairs; ``inflated_sd``): from 3 pairs, the true SD's 95 % interval is 0.52-6.28 times the
   estimate.
3. **Seeds** for power 0.8 of the one-sided paired t-test at the test's level, from the noncentral t
   distribution (``scipy.stats.nct``; for an equivalence test, the TOST's power by one integral): the smallest
   ``n >= MIN_SEEDS`` (``power_at``, ``seeds_for_power``).

Which tests form the family, and the plan frozen from these numbers, are ``bhyt_pl.study.protocol.power_plan``'s.
This module takes plain numbers (per-seed differences as sequences of floats), not the study's result types, so it
does not change when they do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from scipy import integrate
from scipy import stats as _scipy_stats

from bhyt_pl.study.protocol import stats

__all__ = [
    "MIN_SEEDS",
    "POWER",
    "SD_CONFIDENCE",
    "SEARCH_LIMIT",
    "SHRINK_CONFIDENCE",
    "confirmation_seed_indices",
    "inflated_sd",
    "power_at",
    "room_inside",
    "seeds_for_power",
    "shrunk_effect",
]

POWER = 0.8
"""Power every primary test (and the joint power every primary paper-level claim) is planned for."""
SHRINK_CONFIDENCE = 0.80
"""Two-sided confidence of the pilot interval whose bound nearer the decision boundary is the planned effect."""
SD_CONFIDENCE = 0.80
"""One-sided confidence of the upper bound the pilot's SD is inflated to."""
MIN_SEEDS = 3
"""Fewest seeds the plan gives a test: the pilot's own count. With 2 pairs the SD rests on 1 degree of freedom
(its 95 % range spans a factor of about 70) and the one-sided critical t at a family level such as 0.05 / 6 is
about 38, so a 2-pair verdict would hinge on a single difference."""
SEARCH_LIMIT = 1000
"""Largest seed count the plan searches; beyond it a test "needs more than 1000"."""


def _check_rule(rule: str, margin: float) -> None:
    if rule not in stats.RULES:
        raise ValueError(f"rule must be one of {stats.RULES}, got {rule!r}")
    if rule in ("no_worse", "equivalent") and not margin > 0:
        raise ValueError(f"rule {rule!r} needs a margin > 0, got {margin}")


def room_inside(rule: str, margin: float, low: float, high: float) -> float:
    """How far the values ``low .. high`` (an interval, or a mean as both) lie inside the claim's side:
    ``0 - high`` for ``lower``, ``margin - high`` for ``no_worse``, ``low - 0`` for ``higher``,
    ``margin - max(|low|, |high|)`` for ``equivalent``; ``<= 0`` where they reach the boundary or beyond."""
    if rule == "equivalent":
        return margin - max(abs(low), abs(high))
    if rule == "higher":
        return low
    return (margin if rule == "no_worse" else 0.0) - high


def shrunk_effect(
    values: Sequence[float], rule: str, margin: float = 0.0, confidence: float = SHRINK_CONFIDENCE
) -> float:
    """The effect the plan assumes: the distance from the decision boundary to the bound of the pilot's
    two-sided ``confidence`` t-interval nearer it, positive on the claim's side.

    - ``lower``: ``0 - high``; ``no_worse``: ``margin - high``; ``higher``: ``low - 0``;
    - ``equivalent`` (TOST): the room left inside the margin by the bound farther from 0,
      ``margin - max(|low|, |high|)``.

    A value ``<= 0`` means the interval reaches the boundary or the wrong side: the test is infeasible. NaN with
    fewer than 2 finite values.
    """
    _check_rule(rule, margin)
    iv = stats.interval(values, confidence)
    return room_inside(rule, margin, iv.low, iv.high) if iv.defined else math.nan


def inflated_sd(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float:
    """The one-sided ``confidence`` upper confidence bound of a normal SD estimated as ``sd`` from ``n`` values:
    ``sd * sqrt((n - 1) / chi2.ppf(1 - confidence, n - 1))`` (``(n - 1) s^2 / sigma^2`` is chi-square with
    ``n - 1`` degrees of freedom). For ``n = 3`` at 80 %: ``chi2.ppf(0.2, 2) = -2 ln 0.8``, a factor of 2.12."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt((n - 1) / float(_scipy_stats.chi2.ppf(1 - confidence, n - 1)))


def _one_sided_power(effect: float, sd: float, n: int, level: float) -> float:
    """``P(T' >= t_{1-level, n-1})``, ``T'`` noncentral t with ``n - 1`` degrees of freedom and noncentrality
    ``effect * sqrt(n) / sd``: the power of a one-sided paired t-test when the true mean difference lies
    ``effect`` inside the claim's side."""
    df = n - 1
    critical = float(_scipy_stats.t.ppf(1 - level, df))
    return float(_scipy_stats.nct.sf(critical, df, effect * math.sqrt(n) / sd))


def _equivalence_power(room: float, margin: float, sd: float, n: int, level: float) -> float:
    """Power of the paired TOST (both one-sided tests at ``level``) when the true difference is ``margin - room``.

    Both tests reject when ``|mean| < margin - c * s / sqrt(n)``, ``c = t_{1-level, n-1}``; the mean is normal
    and independent of ``s``, whose ``(n - 1) s^2 / sd^2`` is chi-square, so the power is one integral over that
    chi-square (Owen's formula). scipy has no TOST power, hence the integral here.
    """
    df, delta = n - 1, margin - room
    c = float(_scipy_stats.t.ppf(1 - level, df))
    se = sd / math.sqrt(n)
    u_max = df * (margin / (c * se)) ** 2  # beyond it, c * s / sqrt(n) >= margin: no mean can pass both tests

    def accept(u: float) -> float:
        half = margin - c * se * math.sqrt(u / df)  # the mean passes both tests when |mean| < half
        if half <= 0:
            return 0.0
        normal = _scipy_stats.norm
        inside = normal.cdf((half - delta) / se) - normal.cdf((-half - delta) / se)
        return float(inside * _scipy_stats.chi2.pdf(u, df))

    value, _ = integrate.quad(accept, 0.0, u_max, limit=200)
    return min(1.0, max(0.0, value))


def power_at(n: int, effect: float, sd: float, level: float, rule: str = "lower", margin: float = 0.0) -> float:
    """Power at ``n`` pairs of the paired test ``rule`` at ``level`` when the true difference lies ``effect``
    inside the claim's side (for ``equivalent``: ``effect`` inside the margin; ``shrunk_effect``'s convention).
    0 when ``effect <= 0`` (the claim's side is not reached)."""
    _check_rule(rule, margin)
    if n < 2:
        raise ValueError(f"n must be >= 2 pairs (a t-test needs one degree of freedom), got {n}")
    if not (math.isfinite(effect) and math.isfinite(sd) and sd > 0) or effect <= 0:
        return 0.0
    if rule == "equivalent":
        return _equivalence_power(effect, margin, sd, n, level)
    return _one_sided_power(effect, sd, n, level)


def seeds_for_power(
    power: Callable[[int], float], target: float = POWER, minimum: int = MIN_SEEDS, limit: int = SEARCH_LIMIT
) -> int | None:
    """The smallest ``n`` in ``minimum .. limit`` with ``power(n) >= target``, or None when even ``limit`` falls
    short. Power grows with ``n`` for a fixed effect and SD (the noncentrality grows as ``sqrt(n)`` and the
    critical t falls), so the search doubles, then bisects: a few dozen evaluations instead of a scan."""
    if power(minimum) >= target:
        return minimum
    low, high = minimum, minimum  # power(low) < target throughout
    while True:
        high = min(limit, 2 * high)
        if power(high) >= target:
            break
        if high == limit:
            return None
        low = high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= target else (mid, high)
    return high


def confirmation_seed_indices(pilot_indices: Iterable[int], n: int) -> range:
    """``n`` seed indices strictly above every index the pilot used (its selection seed 0 and its evaluation
    seeds 1..N, extensions included), so a confirmation run never repeats a pilot run's initialisation or data
    order. Seed index ``i`` trains with seed ``base seed + i``, as in the exploration."""
    used = [int(i) for i in pilot_indices]
    if not used:
        raise ValueError("pilot_indices is empty: the confirmation needs the pilot's seed indices to stay above them")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    first = max(used) + 1
    return range(first, first + n)

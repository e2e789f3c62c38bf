"""The hand-worked pilot of the power tests and an independent reference for the power of a one-sided paired t-test
(numerical integration over the sample SD's chi-square, not scipy's noncentral t).

The pilot: differences -0.3, -0.2, -0.25 (3 pairs): mean -0.25, sd 0.05.
- 80 % interval: t_{0.90, 2} = 0.8 sqrt(2) / 0.6 = 1.885618 (2 df: F(t) = 1/2 + t / (2 sqrt(2 + t^2))), half-width
  1.885618 * 0.05 / sqrt(3) = 0.054433, so [-0.304433, -0.195567]: the shrunk effect is 0.195567.
- SD inflation: chi2_{0.20, 2} = -2 ln 0.8 = 0.446287 (2 df: F(x) = 1 - exp(-x / 2)), factor sqrt(2 / 0.446287) =
  2.116935, inflated SD 0.105847.
"""

from __future__ import annotations

import math

from scipy import integrate
from scipy import stats as scipy_stats

PILOT = (-0.3, -0.2, -0.25)
EFFECT = 0.25 - 1.885618 * 0.05 / math.sqrt(3)  # 0.195567
SD = 0.05 * math.sqrt(2 / (-2 * math.log(0.8)))  # 0.105847


def reference_power(effect: float, sd: float, n: int, level: float) -> float:
    """Power of the one-sided paired t-test from its definition: it rejects when (Z + ncp) / sqrt(V / df) >= c,
    Z standard normal, V chi-square with df = n - 1 (independent), ncp = effect sqrt(n) / sd; so the power is
    E_V[Phi(ncp - c sqrt(V / df))], one integral over V's density."""
    df, ncp = n - 1, effect * math.sqrt(n) / sd
    c = scipy_stats.t.ppf(1 - level, df)
    value, _ = integrate.quad(
        lambda v: scipy_stats.norm.cdf(ncp - c * math.sqrt(v / df)) * scipy_stats.chi2.pdf(v, df), 0, math.inf
    )
    return value

"""The confirmation's verdicts (docs/method.md, section 10): each primary test of a frozen plan on the confirmation's
own runs (never a pilot seed), Holm across the family, and an intersection-union test per paper-level claim."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TypedDict

from bhyt_pl.study.protocol import power_plan, stats
from bhyt_pl.study.protocol.design import rate_key
from bhyt_pl.study.protocol.metrics import (
    END,
    PhaseDifferences,
    metric,
    paired_at_phase,
    paired_over_training,
    phase_differences,
)
from bhyt_pl.study.protocol.spec import RunResult

__all__ = [
    "ClaimVerdict",
    "Evaluation",
    "FamilyResult",
    "FamilyTestAtStep",
    "evaluate",
    "family_runs",
    "group_rate",
    "p_value",
]


def group_rate(plan: power_plan.Plan) -> float:
    """The learning rate the plan's tests compare at, as its ``source`` recorded it."""
    rate = plan.source["rate"]
    if not isinstance(rate, int | float):
        raise ValueError(f"plan.json's source.rate must be a number, got {rate!r}")
    return float(rate)


def family_runs(plan: power_plan.Plan, runs: Iterable[RunResult], group: str) -> dict[int, RunResult]:
    """``{seed index: run}`` of ``group``'s confirmation runs: its plan candidate at the plan's rate, on the seed
    indices the plan gave it, which lie above every pilot index. Any other run (a pilot seed, another rate or
    candidate) is left out, so a verdict never reads the pilot's data."""
    if group not in plan.group_seeds:
        return {}
    # above every pilot index by the plan's construction (power.confirmation_seed_indices); filtered again here so
    # that no edit of plan.json can let a pilot seed into a verdict
    indices = {i for i in plan.seed_indices(group) if i > max(plan.pilot_seed_indices, default=-1)}
    candidates = plan.source["candidates"]
    if not isinstance(candidates, Mapping):
        raise ValueError(f"plan.json's source.candidates must map each group to its candidate, got {candidates!r}")
    candidate, rate = candidates[group], rate_key(group_rate(plan))
    return {
        r.spec.seed_index: r
        for r in runs
        if r.spec.group == group
        and r.spec.candidate == candidate
        and rate_key(r.spec.lr) == rate
        and r.spec.seed_index in indices
    }


# ----------------------------------------------------------------------------- the verdicts
def p_value(diff: stats.Interval, rule: str, margin: float = 0.0) -> float:
    """The one-sided p-value of a test on the paired difference (``stats.one_sided_p``): ``P(T <= t)`` for
    ``lower``, ``P(T >= t)`` for ``higher``, against ``+margin`` for ``no_worse``, and the larger of the two
    one-sided p-values for ``equivalent`` (TOST). NaN with fewer than 2 pairs."""
    if rule in stats.DIRECTIONS:
        return stats.one_sided_p(diff, rule)
    if rule == "no_worse":
        return stats.one_sided_p(diff, "lower", margin)
    if rule == "equivalent":
        return max(stats.one_sided_p(diff, "higher", -margin), stats.one_sided_p(diff, "lower", margin))
    raise ValueError(f"rule must be one of {stats.RULES}, got {rule!r}")


def _verdict(p: float, alpha: float) -> str:
    if not math.isfinite(p):
        return stats.UNTESTED
    return stats.CONFIRMED if p < alpha else stats.NOT_CONFIRMED


class FamilyTestAtStep(TypedDict):
    """A primary test at one trajectory point (uncorrected, descriptive): its pairs, mean difference, 95 %
    interval and one-sided p-value."""

    step: int
    tokens: int
    n: int
    mean: float
    low: float
    high: float
    p_one_sided: float


@dataclass(frozen=True)
class FamilyResult:
    """One primary test on the confirmation's seeds.

    Args:
        planned: its frozen plan row.
        target_runs, baseline_runs: the run labels it read (the confirmation's seeds only).
        difference: the paired difference ``d`` on the test's scale at its planned phase (the end, step 0, or made
            by training: end minus step 0), with its two-sided 95 % t-interval.
        difference_90: the same with the 90 % interval, whose bounds are the one-sided 95 % bounds.
        p: the one-sided p-value (``p_value``).
        holm_p: Holm's adjusted p-value across the family; the verdict reads it at the plan's alpha.
        verdict: ``confirmed``, ``not confirmed`` or ``untested`` (fewer than 2 pairs).
        over_training: the same test at each trajectory point (uncorrected, descriptive; each point's own value,
            whatever the phase).
        phases: the same pairs' difference at each phase (step 0, the end, made by training; 95 %), whatever phase
            the test declared; descriptive beside the verdict, which reads only the declared one.
    """

    planned: power_plan.PlannedTest
    target_runs: tuple[str, ...]
    baseline_runs: tuple[str, ...]
    difference: stats.Interval
    difference_90: stats.Interval
    p: float
    holm_p: float
    verdict: str
    over_training: tuple[FamilyTestAtStep, ...] = ()
    phases: PhaseDifferences | None = None

    @property
    def log(self) -> bool:
        """Whether ``d`` is an ln ratio (a magnitude or a variance), shown as a geometric-mean ratio."""
        return metric(self.planned.statistic).log

    @property
    def one_sided_bound(self) -> float:
        """The one-sided 95 % bound on the claim's side's far end: the upper bound for ``lower``/``no_worse``,
        the lower one for ``higher`` (NaN for ``equivalent``, which has two)."""
        rule = self.planned.rule
        if rule in ("lower", "no_worse"):
            return self.difference_90.high
        return self.difference_90.low if rule == "higher" else math.nan

    def ratio(self, confidence: float = 0.95) -> stats.GeometricMean | None:
        """The geometric mean of the per-seed ratios with its back-transformed interval (ln-ratio tests only)."""
        if not self.log:
            return None
        ln = self.difference if confidence == 0.95 else self.difference_90
        return stats.GeometricMean(ln)

    def to_dict(self) -> dict[str, object]:
        t = self.planned
        ratio = self.ratio()
        phase = {"phase": t.phase} if t.phase != END else {}  # only when not the end: records written before stay
        return {
            "name": t.name,
            "statistic": t.statistic,
            **phase,
            "scale": "ln ratio" if self.log else "difference",
            "groups": {"target": t.target, "baseline": t.baseline},
            "rule": t.rule,
            "margin": t.margin,
            "rate": t.rate,
            "runs": {"target": list(self.target_runs), "baseline": list(self.baseline_runs)},
            "plan": t.to_dict(),
            "pairs": self.difference.n,
            "difference_95": self.difference.__dict__,
            "difference_90": self.difference_90.__dict__,
            "one_sided_bound_95": self.one_sided_bound,
            "geometric_mean_ratio_95": ratio.to_dict() if ratio is not None else None,
            "p_one_sided": self.p,
            "holm_p": self.holm_p,
            "verdict": self.verdict,
            "over_training": list(self.over_training),
        }


@dataclass(frozen=True)
class ClaimVerdict:
    """A paper-level claim: its plan row and, when primary, its intersection-union test over the components'
    Holm-adjusted p-values."""

    planned: power_plan.PlannedClaim
    iut: stats.IntersectionUnion | None = None

    @property
    def verdict(self) -> str:
        return self.iut.verdict if self.iut is not None else power_plan.EXPLORATORY

    def to_dict(self) -> dict[str, object]:
        c = self.planned
        return {
            "name": c.name,
            "components": list(c.components),
            "status": c.status,
            "reason": c.reason,
            "plan": {"seeds": c.seeds, "joint_power": c.joint_power},
            "p_intersection_union": self.iut.p if self.iut is not None else None,
            "failing": list(self.iut.failing) if self.iut is not None else [],
            "missing": list(self.iut.missing) if self.iut is not None else [],
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Evaluation:
    """The family's tests (in the plan's order) and the paper-level claims."""

    tests: tuple[FamilyResult, ...]
    claims: tuple[ClaimVerdict, ...]

    def test(self, name: str) -> FamilyResult:
        for t in self.tests:
            if t.planned.name == name:
                return t
        raise ValueError(f"no primary test {name!r}; the family: {[t.planned.name for t in self.tests]}")


def _over_training(
    t: power_plan.PlannedTest, a: Mapping[int, RunResult], b: Mapping[int, RunResult], tokens_per_step: int
) -> list[FamilyTestAtStep]:
    """The test at every step both sides recorded, on the seeds with a snapshot there on both sides."""
    points: list[FamilyTestAtStep] = []
    for step, values in paired_over_training(a, b, t.statistic):
        iv = stats.interval(values)
        points.append(
            {
                "step": step,
                "tokens": step * tokens_per_step,
                "n": iv.n,
                "mean": iv.mean,
                "low": iv.low,
                "high": iv.high,
                "p_one_sided": p_value(iv, t.rule, t.margin),
            }
        )
    return points


def evaluate(plan: power_plan.Plan, runs: Iterable[RunResult], tokens_per_step: int = 0) -> Evaluation:
    """Every primary test of ``plan`` on the confirmation's runs (``family_runs``: never a pilot seed), Holm across
    them at the plan's alpha, and each paper-level claim: an intersection-union test of its components' adjusted
    p-values when it is primary, its plan status otherwise."""
    runs = list(runs)
    unadjusted = []
    for t in plan.primary:
        a, b = family_runs(plan, runs, t.target), family_runs(plan, runs, t.baseline)
        values = paired_at_phase(a, b, t.statistic, t.phase)
        d95 = stats.interval(values)
        unadjusted.append(
            FamilyResult(
                planned=t,
                target_runs=tuple(a[i].spec.label for i in sorted(a)),
                baseline_runs=tuple(b[i].spec.label for i in sorted(b)),
                difference=d95,
                difference_90=stats.interval(values, 0.90),
                p=p_value(d95, t.rule, t.margin),
                holm_p=math.nan,
                verdict=stats.UNTESTED,
                over_training=tuple(_over_training(t, a, b, tokens_per_step)),
                phases=phase_differences(a, b, t.statistic),
            )
        )
    adjusted = stats.holm([t.p for t in unadjusted])
    tests = tuple(
        replace(t, holm_p=holm_p, verdict=_verdict(holm_p, plan.alpha))
        for t, holm_p in zip(unadjusted, adjusted, strict=True)
    )
    by_name = {t.planned.name: t for t in tests}
    claims = []
    for c in plan.claims:
        if not c.primary:
            claims.append(ClaimVerdict(c))
            continue
        iut = stats.intersection_union({name: by_name[name].holm_p for name in c.components}, plan.alpha)
        claims.append(ClaimVerdict(c, iut))
    return Evaluation(tests, tuple(claims))

"""The study's claims as data: one row per claim (``CLAIMS``), evaluated by one function (``evaluate``).

A row names two *roles* (``target``, ``baseline``: "BHyT", "RMSNorm", ...); ``--roles`` maps each role to a
``--schemes`` group, so the evaluation never looks at a scheme's name. Each row compares the two groups
through the seed-paired difference ``d = target - baseline`` of one metric (``bhyt_pl.study.metrics``) on
the evaluation seeds, in one arm:

- ``best``: each group at its own best learning rate (loss claims: what a user tuning each scheme gets);
- ``matched``: both groups at the same learning rate, at every matched rate; the verdict holds only when
  it holds at every rate, else it reads "depends on the learning rate" (depth statistics scale with the
  rate, so a comparison across rates measures the rate).

Rules and margins: ``bhyt_pl.study.stats.rule_p_values`` and docs/method.md, section 10. Every (claim, rate)
test also enters a Holm step-down adjustment over every test of the family (a claim outside its condition,
such as the theorem's where lambda/kappa fails the bound, has no test), and every claim is evaluated again at
each trajectory point (claims over training). Adding a claim is adding a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bhyt_pl.study import stats
from bhyt_pl.study.design import StudyDesign, StudyRuns
from bhyt_pl.study.metrics import metric, snapshots, value
from bhyt_pl.study.runner import RunResult

__all__ = [
    "ARMS",
    "CLAIMS",
    "CONDITIONS",
    "ClaimResult",
    "ClaimSpec",
    "Test",
    "evaluate",
]

ARMS = ("best", "matched")

@dataclass(frozen=True)
class ClaimSpec:
    """One claim: a row of ``CLAIMS``.

    Args:
        statement: the claim in the project's words.
        source: the paper statement it tests (``abstract``, ``Figure 3``, ``Table 1``, ``theorem``).
        target, baseline: the roles compared (``d = target - baseline``).
        metric: a ``bhyt_pl.study.metrics`` name: ``val_loss`` or a summary of a registered per-layer statistic.
        arm: ``best`` or ``matched``.
        rule: ``lower``, ``higher``, ``no_worse`` or ``equivalent`` (``stats.rule_p_values``).
        margin: for ``no_worse`` and ``equivalent``; default the metric's own (its statistic's declaration).
        condition: a ``CONDITIONS`` name the target's runs must meet for the claim to apply (else the
            verdict is "outside the theorem").
        bound: the claim compares trained layers with a bound the paper states at initialisation; the
            verdict says so.
    """

    statement: str
    source: str
    target: str
    baseline: str
    metric: str
    arm: str
    rule: str
    margin: float | None = None
    condition: str | None = None
    bound: bool = False

    def __post_init__(self) -> None:
        try:
            metric(self.metric)
        except ValueError as exc:
            raise ValueError(f"claim {self.statement!r}: {exc}") from None
        if self.arm not in ARMS:
            raise ValueError(f"claim {self.statement!r}: arm must be one of {ARMS}, got {self.arm!r}")
        if self.rule not in stats.RULES:
            raise ValueError(f"claim {self.statement!r}: rule must be one of {stats.RULES}, got {self.rule!r}")
        if self.condition is not None and self.condition not in CONDITIONS:
            raise ValueError(f"claim {self.statement!r}: condition must be one of {sorted(CONDITIONS)}")
        if self.rule in ("no_worse", "equivalent") and self.margin_value is None:
            raise ValueError(f"claim {self.statement!r}: rule {self.rule!r} needs a margin (none for {self.metric})")

    @property
    def margin_value(self) -> float | None:
        if self.rule not in ("no_worse", "equivalent"):
            return None
        return self.margin if self.margin is not None else metric(self.metric).margin


def _variance_bound(runs: Sequence[RunResult]) -> tuple[bool | None, str]:
    """The theorem's condition ``lambda / kappa < 1 / sqrt(L)`` at initialisation, from the runs' record."""
    bound = next((r.variance_bound for r in runs if r.variance_bound), None)
    if not bound:
        return None, "no variance-bound record"
    k, n = bound["kappa"], bound["n_layers"]
    lam = max(bound["lambda_attn"], bound["lambda_mlp"])
    holds = bool(bound["at_init"]["all"])
    return holds, f"lambda/kappa = {lam / k:.3g} {'<' if holds else '>='} 1/sqrt({n}) = {1 / math.sqrt(n):.3g}"


CONDITIONS = {"variance_bound": _variance_bound}
"""``name -> fn(target runs) -> (holds or None when unknown, description)``."""


def _c(statement: str, source: str, target: str, baseline: str, metric: str, arm: str, rule: str, **kw: Any):
    return ClaimSpec(statement, source, target, baseline, metric, arm, rule, **kw)


_LOWEST_MAG = "BHyT has the lowest last-layer magnitude"
_LOWEST_VAR = "BHyT has the lowest last-layer variance"
_GROWTH = "BHyT has the lowest depth-wise growth of the {}"
_STAR_GROWTH = "BHyT* has the lowest depth-wise growth of the {}"
_NO_WORSE = "BHyT's loss is no worse than RMSNorm's"
_ORDER = "the 1B eval-loss ordering BHyT < LNS < RMSNorm < Peri-LN < DyT"
_THEOREM = "the last-layer variance is below LNS's where lambda/kappa < 1/sqrt(L)"
_BOUND = {"condition": "variance_bound", "bound": True}  # the theorem's condition, and its verdict's caveat
_SAME_MAG = "BHyT ~ BHyT* in last-layer magnitude"
_SAME_VAR = "BHyT ~ BHyT* in last-layer variance"
_EXACT4 = "BHyT exact 4 layers"

CLAIMS: tuple[ClaimSpec, ...] = (
    # Figure 3 (and the abstract): BHyT keeps the deepest layer's output smallest, compared at one rate
    _c(_LOWEST_MAG, "Figure 3", "BHyT", "RMSNorm", "magnitude", "matched", "lower"),
    _c(_LOWEST_MAG, "Figure 3", "BHyT", "LayerNorm", "magnitude", "matched", "lower"),
    _c(_LOWEST_MAG, "Figure 3", "BHyT", "LNS", "magnitude", "matched", "lower"),
    _c(_LOWEST_MAG, "Figure 3", "BHyT", "Peri-LN", "magnitude", "matched", "lower"),
    _c(_LOWEST_MAG, "Figure 3", "BHyT", "DyT", "magnitude", "matched", "lower"),
    _c(_LOWEST_VAR, "Figure 3", "BHyT", "RMSNorm", "variance", "matched", "lower"),
    _c(_LOWEST_VAR, "Figure 3", "BHyT", "LayerNorm", "variance", "matched", "lower"),
    _c(_LOWEST_VAR, "Figure 3", "BHyT", "LNS", "variance", "matched", "lower"),
    _c(_LOWEST_VAR, "Figure 3", "BHyT", "Peri-LN", "variance", "matched", "lower"),
    _c(_LOWEST_VAR, "Figure 3", "BHyT", "DyT", "variance", "matched", "lower"),
    # the abstract: BHyT stops the magnitude and variance from growing with depth
    _c(_GROWTH.format("magnitude"), "abstract", "BHyT", "RMSNorm", "magnitude_growth", "matched", "lower"),
    _c(_GROWTH.format("magnitude"), "abstract", "BHyT", "LayerNorm", "magnitude_growth", "matched", "lower"),
    _c(_GROWTH.format("magnitude"), "abstract", "BHyT", "LNS", "magnitude_growth", "matched", "lower"),
    _c(_GROWTH.format("magnitude"), "abstract", "BHyT", "Peri-LN", "magnitude_growth", "matched", "lower"),
    _c(_GROWTH.format("magnitude"), "abstract", "BHyT", "DyT", "magnitude_growth", "matched", "lower"),
    _c(_GROWTH.format("variance"), "abstract", "BHyT", "RMSNorm", "variance_growth", "matched", "lower"),
    _c(_GROWTH.format("variance"), "abstract", "BHyT", "LayerNorm", "variance_growth", "matched", "lower"),
    _c(_GROWTH.format("variance"), "abstract", "BHyT", "LNS", "variance_growth", "matched", "lower"),
    _c(_GROWTH.format("variance"), "abstract", "BHyT", "Peri-LN", "variance_growth", "matched", "lower"),
    _c(_GROWTH.format("variance"), "abstract", "BHyT", "DyT", "variance_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("magnitude"), "abstract", "BHyT*", "RMSNorm", "magnitude_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("magnitude"), "abstract", "BHyT*", "LayerNorm", "magnitude_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("magnitude"), "abstract", "BHyT*", "LNS", "magnitude_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("magnitude"), "abstract", "BHyT*", "Peri-LN", "magnitude_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("magnitude"), "abstract", "BHyT*", "DyT", "magnitude_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("variance"), "abstract", "BHyT*", "RMSNorm", "variance_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("variance"), "abstract", "BHyT*", "LayerNorm", "variance_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("variance"), "abstract", "BHyT*", "LNS", "variance_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("variance"), "abstract", "BHyT*", "Peri-LN", "variance_growth", "matched", "lower"),
    _c(_STAR_GROWTH.format("variance"), "abstract", "BHyT*", "DyT", "variance_growth", "matched", "lower"),
    # Table 1: BHyT trains at least as well as the RMSNorm baseline, each at its own best rate
    _c(_NO_WORSE, "Table 1", "BHyT", "RMSNorm", "val_loss", "best", "no_worse"),
    _c(_NO_WORSE, "Table 1", "BHyT lambda_attn 1", "RMSNorm", "val_loss", "best", "no_worse"),
    # section 3: the approximated site-B statistic costs nothing against exact statistics (BHyT*)
    _c("BHyT ~ BHyT* in loss", "Table 1", "BHyT", "BHyT*", "val_loss", "best", "equivalent"),
    _c(_SAME_MAG, "Figure 3", "BHyT", "BHyT*", "magnitude", "matched", "equivalent"),
    _c(_SAME_VAR, "Figure 3", "BHyT", "BHyT*", "variance", "matched", "equivalent"),
    _c("BHyT ~ BHyT* in loss", "Table 1", _EXACT4, "BHyT*", "val_loss", "best", "equivalent"),
    _c(_SAME_MAG, "Figure 3", _EXACT4, "BHyT*", "magnitude", "matched", "equivalent"),
    _c(_SAME_VAR, "Figure 3", _EXACT4, "BHyT*", "variance", "matched", "equivalent"),
    # Table 1 (1B models): the published order of evaluation losses, adjacent pairs
    _c(_ORDER, "Table 1", "BHyT", "LNS", "val_loss", "best", "lower"),
    _c(_ORDER, "Table 1", "LNS", "RMSNorm", "val_loss", "best", "lower"),
    _c(_ORDER, "Table 1", "RMSNorm", "Peri-LN", "val_loss", "best", "lower"),
    _c(_ORDER, "Table 1", "Peri-LN", "DyT", "val_loss", "best", "lower"),
    # the theorem: BHyT's variance below LNS's under lambda/kappa < 1/sqrt(L) (stated at initialisation)
    _c(_THEOREM, "theorem", "BHyT", "LNS", "variance", "matched", "lower", **_BOUND),
    _c(_THEOREM, "theorem", "BHyT lambda_attn 1", "LNS", "variance", "matched", "lower", **_BOUND),
    _c(_THEOREM, "theorem", _EXACT4, "LNS", "variance", "matched", "lower", **_BOUND),
    _c(_THEOREM, "theorem", "BHyT*", "LNS", "variance", "matched", "lower", **_BOUND),
)
"""The claims the study tests, one row each (docs/method.md, section 10)."""

OUTSIDE = "outside the theorem"
BOUND_NOTE = " (trained last layer vs a bound stated at initialisation)"


@dataclass
class Test:
    """One claim at one rate (best arm: one test; matched arm: one per matched rate)."""

    rate: str
    lrs: tuple[float, float]
    target_runs: list[str]
    baseline_runs: list[str]
    difference: stats.Interval
    difference_90: stats.Interval
    p_for: float
    p_against: float
    verdict: str
    holm_p_for: float = math.nan
    holm_p_against: float = math.nan
    holm_verdict: str = stats.INCONCLUSIVE
    over_training: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ClaimResult:
    """A claim evaluated: its groups, its tests, the combined verdicts and the condition where it has one."""

    spec: ClaimSpec
    target: str
    baseline: str
    tests: list[Test]
    condition: str = ""
    applies: bool = True

    def _label(self, labels: list[str]) -> str:
        if not self.applies:
            return OUTSIDE
        label = stats.combine(labels)
        return label + (BOUND_NOTE if self.spec.bound else "")

    @property
    def verdict(self) -> str:
        return self._label([t.verdict for t in self.tests])

    @property
    def holm_verdict(self) -> str:
        return self._label([t.holm_verdict for t in self.tests])

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "statement": spec.statement,
            "source": spec.source,
            "roles": {"target": spec.target, "baseline": spec.baseline},
            "groups": {"target": self.target, "baseline": self.baseline},
            "metric": spec.metric,
            "arm": spec.arm,
            "rule": spec.rule,
            "margin": spec.margin_value,
            "condition": self.condition,
            "verdict": self.verdict,
            "holm_verdict": self.holm_verdict,
            "tests": [
                {
                    "rate": t.rate,
                    "lrs": {"target": t.lrs[0], "baseline": t.lrs[1]},
                    "runs": {"target": t.target_runs, "baseline": t.baseline_runs},
                    "difference_95": t.difference.__dict__,
                    "difference_90": t.difference_90.__dict__,
                    "p_for": t.p_for,
                    "p_against": t.p_against,
                    "verdict": t.verdict,
                    "holm_p_for": t.holm_p_for,
                    "holm_p_against": t.holm_p_against,
                    "holm_verdict": t.holm_verdict,
                    "over_training": t.over_training,
                }
                for t in self.tests
            ],
        }


def _test(spec: ClaimSpec, rate: str, lrs: tuple[float, float], a: list[RunResult], b: list[RunResult], tps: int):
    margin = spec.margin_value or 0.0
    values = stats.paired_differences(
        {r.spec.seed_index: value(r, spec.metric) for r in a}, {r.spec.seed_index: value(r, spec.metric) for r in b}
    )
    d95, d90 = stats.interval(values), stats.interval(values, confidence=0.90)
    p_for, p_against = stats.rule_p_values(d95, spec.rule, margin)
    test = Test(
        rate,
        lrs,
        [r.spec.label for r in a],
        [r.spec.label for r in b],
        d95,
        d90,
        p_for,
        p_against,
        stats.label_from_p(p_for, p_against),
    )
    # claims over training: the same test at every step some finished run of each side recorded. snapshots() is
    # empty for a diverged or failed run, so such a run only loses its own pair (as at the end), never the points.
    traj_a = {r.spec.seed_index: snapshots(r) for r in a}
    traj_b = {r.spec.seed_index: snapshots(r) for r in b}
    steps = sorted(set().union(*traj_a.values()) & set().union(*traj_b.values()))
    by_seed_a, by_seed_b = {r.spec.seed_index: r for r in a}, {r.spec.seed_index: r for r in b}
    for step in steps:
        # only the seeds with a snapshot at this step on both sides pair up (value() of no snapshot is the end)
        seeds = sorted(i for i in set(traj_a) & set(traj_b) if step in traj_a[i] and step in traj_b[i])
        point_values = stats.paired_differences(
            {i: value(by_seed_a[i], spec.metric, traj_a[i][step]) for i in seeds},
            {i: value(by_seed_b[i], spec.metric, traj_b[i][step]) for i in seeds},
        )
        iv = stats.interval(point_values)
        pf, pa = stats.rule_p_values(iv, spec.rule, margin)
        test.over_training.append(
            {
                "step": step,
                "tokens": step * tps,
                "n": iv.n,
                "mean": iv.mean,
                "low": iv.low,
                "high": iv.high,
                "verdict": stats.label_from_p(pf, pa),
            }
        )
    return test


def evaluate(
    runs: StudyRuns | Sequence[RunResult],
    design: StudyDesign,
    roles: Mapping[str, str],
    claims: Sequence[ClaimSpec] = CLAIMS,
    tokens_per_step: int = 0,
) -> tuple[list[ClaimResult], list[ClaimSpec]]:
    """Every claim whose two roles map to groups with a kept candidate: its tests at each rate of its arm, the
    per-test and combined verdicts, and the Holm-adjusted verdicts over the tests of every claim whose condition
    holds. Returns the evaluated claims and the claims left out (a role without a group). ``tokens_per_step``
    is the x axis of claims over training."""
    runs = runs if isinstance(runs, StudyRuns) else StudyRuns(runs)
    out: list[ClaimResult] = []
    skipped: list[ClaimSpec] = []
    for spec in claims:
        target, baseline = roles.get(spec.target), roles.get(spec.baseline)
        kept_target = design.kept(target) if target is not None else None
        kept_baseline = design.kept(baseline) if baseline is not None else None
        if kept_target is None or kept_baseline is None:
            skipped.append(spec)
            continue
        if spec.arm == "best":
            rates = [("best", (kept_target.lr, kept_baseline.lr))]
        else:
            rates = [(f"{lr:g}", (lr, lr)) for lr in design.matched_lrs]
        tests = []
        for rate, (la, lb) in rates:
            a = design.evaluation_runs(runs, target, la)
            b = design.evaluation_runs(runs, baseline, lb)
            tests.append(_test(spec, rate, (la, lb), a, b, tokens_per_step))
        result = ClaimResult(spec, target, baseline, tests)
        if spec.condition is not None:
            condition_runs = [r for la, _ in (t.lrs for t in tests) for r in design.evaluation_runs(runs, target, la)]
            holds, result.condition = CONDITIONS[spec.condition](condition_runs)
            result.applies = holds is True
        out.append(result)
    family = [t for c in out if c.applies for t in c.tests]
    for t, pf, pa in zip(
        family, stats.holm([t.p_for for t in family]), stats.holm([t.p_against for t in family]), strict=True
    ):
        t.holm_p_for, t.holm_p_against = pf, pa
        t.holm_verdict = stats.label_from_p(pf, pa)
    return out, skipped

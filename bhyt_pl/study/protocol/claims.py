"""The study's claims as data: one row per claim (``CLAIMS``), evaluated by one function (``evaluate``).

A row names two *roles* (``target``, ``baseline``: "BHyT", "RMSNorm", ...); ``--roles`` maps each role to a
``--schemes`` group, so the evaluation never looks at a scheme's name. Each row compares the two groups
through the seed-paired difference ``d = target - baseline`` of one metric (``bhyt_pl.study.protocol.metrics``) on
the evaluation seeds, in one arm:

- ``best``: each group at its own best learning rate (loss claims: what a user tuning each scheme gets);
- ``matched``: both groups at the same learning rate, at every matched rate; the verdict holds only when
  it holds at every rate, else it reads "depends on the learning rate" (depth statistics scale with the
  rate, so a comparison across rates measures the rate).

Rules and margins: ``bhyt_pl.study.protocol.stats.rule_p_values`` and docs/method.md, section 10. Every (claim, rate)
test also enters a Holm step-down adjustment over every test of the family (a claim outside its condition,
such as the theorem's where lambda/kappa fails the bound, has no test), and every claim is evaluated again at
each trajectory point (claims over training). Adding a claim is adding a row.

The same table declares the confirmation's primary family (docs/method.md, section 10, "Confirmation";
``bhyt_pl.study.cli.confirmation_plan``): a row marked ``primary`` is one directional test at the matched rate that the
confirmation's power plan admits unless the pilot cannot power it; every other row stays exploratory there, with
its declared reason (``why``). ``POST_HOC`` holds the rows declared after the exploration's results (the median
token): the exploration does not test them, the confirmation does, on new seeds. ``PAPER_CLAIMS`` are the paper's
"BHyT has the lowest X" claims as intersection-union tests over rows of the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns
from bhyt_pl.study.protocol.metrics import (
    END,
    PHASE_NAMES,
    PHASES,
    PhaseDifferences,
    metric,
    paired_at_phase,
    paired_over_training,
    phase_differences,
)
from bhyt_pl.study.protocol.spec import RunResult

__all__ = [
    "ARMS",
    "CLAIMS",
    "CONDITIONS",
    "CONFIRMATION_ROWS",
    "PAPER_CLAIMS",
    "POST_HOC",
    "ClaimResult",
    "ClaimAtStep",
    "ClaimSpec",
    "PaperClaimSpec",
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
        metric: a ``bhyt_pl.study.protocol.metrics`` name: ``val_loss`` or a summary of a registered per-layer
        statistic.
        arm: ``best`` or ``matched``.
        rule: ``lower``, ``higher``, ``no_worse`` or ``equivalent`` (``stats.rule_p_values``).
        margin: for ``no_worse`` and ``equivalent``; default the metric's own (its statistic's declaration).
        condition: a ``CONDITIONS`` name the target's runs must meet for the claim to apply (else the
            verdict is "outside the theorem").
        bound: the claim compares trained layers with a bound the paper states at initialisation; the
            verdict says so.
        primary: proposed for the confirmation's primary family: one directional test (``lower`` or ``higher``)
            at the matched rate, kept by the power plan unless the pilot makes it infeasible or it needs more than
            ``--max-seeds`` (docs/method.md, section 10, "Confirmation").
        why: for a primary row, the paper statement and the reason it is in the family; for any other row, the
            declared reason it stays exploratory in the confirmation.
        phase: when the metric is read (``bhyt_pl.study.protocol.metrics.PHASES``): ``end`` (default), ``init``
            (step 0) or ``training`` (end minus step 0, what training made); claims over training read each step.
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
    primary: bool = False
    why: str = ""
    phase: str = END

    def __post_init__(self) -> None:
        try:
            metric(self.metric)
        except ValueError as exc:
            raise ValueError(f"claim {self.statement!r}: {exc}") from None
        if self.arm not in ARMS:
            raise ValueError(f"claim {self.statement!r}: arm must be one of {ARMS}, got {self.arm!r}")
        if self.phase not in PHASES:
            raise ValueError(f"claim {self.statement!r}: phase must be one of {PHASES}, got {self.phase!r}")
        if self.rule not in stats.RULES:
            raise ValueError(f"claim {self.statement!r}: rule must be one of {stats.RULES}, got {self.rule!r}")
        if self.condition is not None and self.condition not in CONDITIONS:
            raise ValueError(f"claim {self.statement!r}: condition must be one of {sorted(CONDITIONS)}")
        if self.rule in ("no_worse", "equivalent") and self.margin_value is None:
            raise ValueError(f"claim {self.statement!r}: rule {self.rule!r} needs a margin (none for {self.metric})")
        if self.primary and (self.arm != "matched" or self.rule not in stats.DIRECTIONS):
            raise ValueError(
                f"claim {self.statement!r}: a primary row is one directional test at the matched rate (arm "
                f"'matched', rule one of {stats.DIRECTIONS}), got arm {self.arm!r} and rule {self.rule!r}"
            )
        if self.primary and not self.why:
            raise ValueError(f"claim {self.statement!r}: a primary row needs its reason (why='...')")

    @property
    def name(self) -> str:
        """The test's short name: ``target <rule> baseline: metric`` (``BHyT < RMSNorm: median_magnitude``), marked
        ``[theorem]`` for a conditional row and followed by a phase other than the end (``..., made by training``);
        unique within ``CONFIRMATION_ROWS``."""
        relation = {"lower": "<", "higher": ">", "no_worse": "no worse than", "equivalent": "~"}[self.rule]
        mark = f" [{self.source}]" if self.condition is not None else ""
        phase = f", {PHASE_NAMES[self.phase]}" if self.phase != END else ""
        return f"{self.target} {relation} {self.baseline}: {self.metric}{mark}{phase}"

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


class _ClaimOptions(TypedDict, total=False):
    """``ClaimSpec``'s optional fields, as the table below passes them."""

    margin: float | None
    condition: str | None
    bound: bool
    primary: bool
    why: str
    phase: str


def _c(
    statement: str,
    source: str,
    target: str,
    baseline: str,
    metric: str,
    arm: str,
    rule: str,
    **kw: Unpack[_ClaimOptions],
) -> ClaimSpec:
    return ClaimSpec(statement, source, target, baseline, metric, arm, rule, **kw)


_LOWEST_MAG = "BHyT has the lowest last-layer magnitude"
_LOWEST_MEDIAN = "BHyT has the lowest last-layer median-token magnitude"
_LOWEST_VAR = "BHyT has the lowest last-layer variance"
_GROWTH = "BHyT has the lowest depth-wise growth of the {}"
_STAR_GROWTH = "BHyT* has the lowest depth-wise growth of the {}"
_NO_WORSE = "BHyT's loss is no worse than RMSNorm's"
_ORDER = "the 1B eval-loss ordering BHyT < LNS < RMSNorm < Peri-LN < DyT"
_THEOREM = "the last-layer variance is below LNS's where lambda/kappa < 1/sqrt(L)"
_BOUND: _ClaimOptions = {
    "condition": "variance_bound",
    "bound": True,
}  # the theorem's condition, and its verdict's caveat
_SAME_MAG = "BHyT ~ BHyT* in last-layer magnitude"
_SAME_VAR = "BHyT ~ BHyT* in last-layer variance"
_EXACT4 = "BHyT exact 4 layers"

# The confirmation's declarations (docs/method.md, section 10, "Confirmation"): why a primary row is in the family,
# why any other row stays exploratory. Written before any confirmation run.
_MEDIAN_WHY = (
    "Figure 3, on the median token: a few tokens carry BHyT's mean-token magnitude, and the median was picked "
    "after seeing the exploration, so it is confirmed on new seeds"
)
_VAR_WHY = "Figure 3: BHyT's last-layer variance"
_MAG_GROWTH_WHY = "abstract: BHyT stops the magnitude growing with depth"
_VAR_GROWTH_WHY = "abstract: BHyT stops the variance growing with depth"
_STAR_WHY = "abstract, for the exact statistics (BHyT*)"
_DYT = "DyT did not train at the pilot's budget (near the unigram loss; no block matters): it says nothing of BHyT"
_MEAN_TOKEN = "the mean token: replaced by the median token (a few tokens carry BHyT's mean-token magnitude)"
_BEST_ARM = "compares each group at its own best rate; the confirmation trains the matched rate only"
_TOST = "an equivalence (two one-sided tests), not one directional comparison"
_THEOREM_PRIMARY = {"primary": True, "why": "the theorem, where its condition holds on the pilot's runs"}


def _lowest(statement: str, target: str, metric: str, why: str, exploratory: dict[str, str] | None = None):
    """One row per baseline of a "``target`` has the lowest ``metric``" claim at the matched rate: primary with
    ``why`` unless ``exploratory`` gives the baseline's reason to stay out (DyT's everywhere)."""
    out = {"DyT": _DYT} | (exploratory or {})
    source = "abstract" if "growth" in metric else "Figure 3"
    rows = []
    for baseline in ("RMSNorm", "LayerNorm", "LNS", "Peri-LN", "DyT"):
        declared = {"why": out[baseline]} if baseline in out else {"why": why, "primary": True}
        rows.append(_c(statement, source, target, baseline, metric, "matched", "lower", **declared))
    return tuple(rows)


_ALL_MEAN_TOKEN = {b: _MEAN_TOKEN for b in ("RMSNorm", "LayerNorm", "LNS", "Peri-LN")}

CLAIMS: tuple[ClaimSpec, ...] = (
    # Figure 3 (and the abstract): BHyT keeps the deepest layer's output smallest, compared at one rate
    *_lowest(_LOWEST_MAG, "BHyT", "magnitude", "", _ALL_MEAN_TOKEN),
    *_lowest(_LOWEST_VAR, "BHyT", "variance", _VAR_WHY),
    # the abstract: BHyT stops the magnitude and variance from growing with depth
    *_lowest(_GROWTH.format("magnitude"), "BHyT", "magnitude_growth", _MAG_GROWTH_WHY),
    *_lowest(_GROWTH.format("variance"), "BHyT", "variance_growth", _VAR_GROWTH_WHY),
    *_lowest(_STAR_GROWTH.format("magnitude"), "BHyT*", "magnitude_growth", _STAR_WHY),
    *_lowest(_STAR_GROWTH.format("variance"), "BHyT*", "variance_growth", _STAR_WHY),
    # Table 1: BHyT trains at least as well as the RMSNorm baseline, each at its own best rate
    _c(_NO_WORSE, "Table 1", "BHyT", "RMSNorm", "val_loss", "best", "no_worse", why=_BEST_ARM),
    _c(_NO_WORSE, "Table 1", "BHyT lambda_attn 1", "RMSNorm", "val_loss", "best", "no_worse", why=_BEST_ARM),
    # section 3: the approximated site-B statistic costs nothing against exact statistics (BHyT*)
    _c("BHyT ~ BHyT* in loss", "Table 1", "BHyT", "BHyT*", "val_loss", "best", "equivalent", why=_BEST_ARM),
    _c(_SAME_MAG, "Figure 3", "BHyT", "BHyT*", "magnitude", "matched", "equivalent", why=_TOST),
    _c(_SAME_VAR, "Figure 3", "BHyT", "BHyT*", "variance", "matched", "equivalent", why=_TOST),
    _c("BHyT ~ BHyT* in loss", "Table 1", _EXACT4, "BHyT*", "val_loss", "best", "equivalent", why=_BEST_ARM),
    _c(_SAME_MAG, "Figure 3", _EXACT4, "BHyT*", "magnitude", "matched", "equivalent", why=_TOST),
    _c(_SAME_VAR, "Figure 3", _EXACT4, "BHyT*", "variance", "matched", "equivalent", why=_TOST),
    # Table 1 (1B models): the published order of evaluation losses, adjacent pairs
    _c(_ORDER, "Table 1", "BHyT", "LNS", "val_loss", "best", "lower", why=_BEST_ARM),
    _c(_ORDER, "Table 1", "LNS", "RMSNorm", "val_loss", "best", "lower", why=_BEST_ARM),
    _c(_ORDER, "Table 1", "RMSNorm", "Peri-LN", "val_loss", "best", "lower", why=_BEST_ARM),
    _c(_ORDER, "Table 1", "Peri-LN", "DyT", "val_loss", "best", "lower", why=_DYT),
    # the theorem: BHyT's variance below LNS's under lambda/kappa < 1/sqrt(L) (stated at initialisation)
    *(
        _c(_THEOREM, "theorem", target, "LNS", "variance", "matched", "lower", **_BOUND, **_THEOREM_PRIMARY)
        for target in ("BHyT", "BHyT lambda_attn 1", _EXACT4, "BHyT*")
    ),
)
"""The claims the study tests, one row each (docs/method.md, section 10)."""

POST_HOC: tuple[ClaimSpec, ...] = _lowest(_LOWEST_MEDIAN, "BHyT", "median_magnitude", _MEDIAN_WHY)
"""Rows declared after the exploration's results: the median token, because a few tokens carry BHyT's mean-token
magnitude. The exploration does not test them (its family was fixed before it saw them); the confirmation does, on
new seeds."""

CONFIRMATION_ROWS: tuple[ClaimSpec, ...] = (*POST_HOC, *CLAIMS)
"""Every row the confirmation plans for, in the order its family is listed and Holm's ties are broken."""


@dataclass(frozen=True)
class PaperClaimSpec:
    """A paper-level claim: the intersection of several rows (one per baseline), so it holds only if every row does
    (an intersection-union test; ``bhyt_pl.study.protocol.stats.intersection_union``).

    Args:
        statement: the claim in the project's words.
        components: the rows, by ``ClaimSpec.name``.
        why: what it tests, and why its baselines are these.
    """

    statement: str
    components: tuple[str, ...]
    why: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        names = {c.name for c in CONFIRMATION_ROWS}
        unknown = [n for n in self.components if n not in names]
        if unknown or not self.components:
            raise ValueError(f"paper claim {self.statement!r}: components must name rows of the table, got {unknown}")


def _over(statement: str, baselines: Sequence[str] | None = None) -> tuple[str, ...]:
    """The names of ``statement``'s rows (only those against ``baselines`` when given)."""
    rows = [c for c in CONFIRMATION_ROWS if c.statement == statement]
    return tuple(c.name for c in rows if baselines is None or c.baseline in baselines)


PAPER_CLAIMS: tuple[PaperClaimSpec, ...] = (
    PaperClaimSpec(
        "BHyT's last-layer median-token magnitude is below RMSNorm's, LayerNorm's and Peri-LN's",
        _over(_LOWEST_MEDIAN, ("RMSNorm", "LayerNorm", "Peri-LN")),
        "Figure 3 against the baselines the pilot can power: LNS's pilot interval crosses zero, DyT did not train",
    ),
    *(
        PaperClaimSpec(statement, _over(statement), why)
        for statement, why in (
            (_LOWEST_MEDIAN, "Figure 3, every baseline"),
            (_LOWEST_MAG, "Figure 3, every baseline"),
            (_LOWEST_VAR, "Figure 3, every baseline"),
            (_GROWTH.format("magnitude"), "the abstract, every baseline"),
            (_GROWTH.format("variance"), "the abstract, every baseline"),
            (_STAR_GROWTH.format("magnitude"), "the abstract, every baseline"),
            (_STAR_GROWTH.format("variance"), "the abstract, every baseline"),
            (_ORDER, "Table 1 at 1B, every adjacent pair"),
        )
    ),
)
"""The paper-level claims the confirmation reads as intersection-union tests over rows of the table; one is
primary when every component is in the family and the plan can give it joint power 0.8."""

OUTSIDE = "outside the theorem"
BOUND_NOTE = " (trained last layer vs a bound stated at initialisation)"


class ClaimAtStep(TypedDict):
    """A claim's test at one trajectory point (uncorrected, descriptive): its pairs, mean difference, interval at
    the report's confidence and verdict."""

    step: int
    tokens: int
    n: int
    mean: float
    low: float
    high: float
    confidence: float
    verdict: str


@dataclass
class Test:
    """One claim at one rate (best arm: one test; matched arm: one per matched rate). ``phases``: the same pairs'
    difference at each phase (step 0, the end, made by training; 95 %), whatever phase the claim tests; shown
    beside the verdicts, never deciding one."""

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
    over_training: list[ClaimAtStep] = field(default_factory=list)
    phases: PhaseDifferences | None = None


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

    def to_dict(self) -> dict[str, object]:
        """The record's row; ``phase`` only when it is not the end (records of end-only claims stay as written)."""
        spec = self.spec
        phase = {"phase": spec.phase} if spec.phase != END else {}
        return {
            "statement": spec.statement,
            "source": spec.source,
            "roles": {"target": spec.target, "baseline": spec.baseline},
            "groups": {"target": self.target, "baseline": self.baseline},
            "metric": spec.metric,
            "arm": spec.arm,
            **phase,
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
    by_seed_a, by_seed_b = {r.spec.seed_index: r for r in a}, {r.spec.seed_index: r for r in b}
    values = paired_at_phase(by_seed_a, by_seed_b, spec.metric, spec.phase)
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
        phases=phase_differences(by_seed_a, by_seed_b, spec.metric),
    )
    # claims over training: the same test at every step some finished run of each side recorded, each point with
    # the interval its rule decides by (90 % for a TOST, else 95 %). snapshots() is
    # empty for a diverged or failed run, so such a run only loses its own pair (as at the end), never the points.
    confidence = 0.90 if spec.rule == "equivalent" else 0.95
    for step, point_values in paired_over_training(by_seed_a, by_seed_b, spec.metric):
        iv = stats.interval(point_values)
        pf, pa = stats.rule_p_values(iv, spec.rule, margin)
        shown = stats.interval(point_values, confidence) if confidence != iv.confidence else iv
        test.over_training.append(
            {
                "step": step,
                "tokens": step * tps,
                "n": iv.n,
                "mean": iv.mean,
                "low": shown.low,
                "high": shown.high,
                "confidence": confidence,
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

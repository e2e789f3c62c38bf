"""What the token-budget map measures, from its runs alone: per budget, each scheme's validation-loss difference to
the reference with its paired-t interval and the smallest difference its seeds could detect; where that difference
changes sign along log T/P; and whether early tanh saturation predicts its sign (docs/method.md, section 11).

Everything here is a function of the finished runs and the design; nothing is fitted on the cells it is scored on:
the saturation rule's cut (``SATURATION_CUT``) and early point are fixed before the runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy import optimize as _scipy_optimize
from scipy import stats as _scipy_stats

from bhyt_pl.study.protocol.metrics import (
    VAL_LOSS,
    PhaseDifferences,
    effect_origin,
    phase_differences,
    snapshots,
    value,
)
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.protocol.stats import ALPHA, Interval, interval
from bhyt_pl.study.protocol.token_budget import BudgetDesign, TokenBudget

__all__ = [
    "DEPTH_METRICS",
    "POWER",
    "SATURATION_CUT",
    "SATURATION_METRIC",
    "Arms",
    "BudgetEffect",
    "Crossover",
    "SaturationCell",
    "SaturationRule",
    "budget_effects",
    "crossover",
    "early_saturation",
    "minimum_detectable_difference",
    "saturation_rule",
    "sign_changes",
    "validation_noise",
]

POWER = 0.8
"""The power the minimum detectable difference is read at."""

DEPTH_METRICS = {
    "median_magnitude": "ln last-layer median-token magnitude",
    "magnitude_growth": "ln magnitude growth L/4..L",
    "variance_growth": "ln variance growth L/4..L",
}
"""The depth claims the map reads at three arms (the confirmation's metrics), with the words a table names them by."""

SATURATION_METRIC = "saturation"
"""The registered statistic: the fraction of a bounded site's arguments with ``|argument| > 2``, mean over sites and
layers."""

SATURATION_CUT = 0.36
"""The early-saturation rule: a scheme whose early saturation is at least this is predicted to lower the validation
loss against the reference (bounding regularises), below it to raise it. Fixed before the map ran: the midpoint of
the two saturation levels arXiv 2604.23434 reports for DyT, 0.49 where it helped (1M tokens) and 0.23 where it hurt
(118M tokens)."""


def minimum_detectable_difference(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true mean difference a two-sided paired t-test at ``alpha`` detects with probability ``power`` from ``n``
    pairs whose differences have standard deviation ``sd``: the ``delta`` where the noncentral t's two tails past
    ``t_{1 - alpha/2, n-1}`` (noncentrality ``delta sqrt(n) / sd``) hold ``power``. NaN below 2 pairs or for a
    spread that is not positive and finite."""
    if n < 2 or not (math.isfinite(sd) and sd > 0):
        return math.nan
    df = n - 1
    critical = float(_scipy_stats.t.ppf(1 - alpha / 2, df))

    def shortfall(delta: float) -> float:
        nc = delta * math.sqrt(n) / sd
        # the far tail (a significant difference of the wrong sign) is below 1e-8 where scipy's series returns NaN
        far = float(_scipy_stats.nct.cdf(-critical, df, nc))
        return float(_scipy_stats.nct.sf(critical, df, nc)) + (far if math.isfinite(far) else 0.0) - power

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return float(_scipy_optimize.brentq(shortfall, 0.0, high, xtol=1e-12 * sd))


@dataclass(frozen=True)
class Arms:
    """One depth metric's per-seed paired difference (scheme minus reference) at each phase of the runs: at
    initialisation (step 0), at the end and made by training (end minus step 0), with where the end effect comes
    from in words (``metrics.effect_origin``)."""

    metric: str
    phases: PhaseDifferences

    @property
    def origin(self) -> str:
        return effect_origin(self.phases.init, self.phases.end, self.phases.training)


@dataclass(frozen=True)
class BudgetEffect:
    """One scheme against the reference on one budget, paired per evaluation seed.

    Args:
        budget: the budget.
        group: the scheme group.
        lr: its selected (or inherited) rate; NaN before its selection.
        reference_lr: the reference's rate.
        loss: validation loss, scheme minus reference, over the seeds (``per_seed``: each seed's difference).
        mdd: the minimum difference ``loss``'s seeds detect at 80 % power (``minimum_detectable_difference``).
        gap: the scheme's train-validation gap (validation loss minus the mean training loss over the run's last
            10 % of steps), per seed.
        arms: the depth metrics' three arms.
        saturation_end: the scheme's tanh saturation at the end, per seed (NaN: no bounded site).
        saturation_early: the same at the budget's early step.
        val_noise_se: the validation batches' own standard error of the paired loss difference (mean over seeds of
            ``sd over batches / sqrt(batches)``): the part of ``loss`` that more validation tokens would remove.
    """

    budget: TokenBudget
    group: str
    lr: float
    reference_lr: float
    loss: Interval
    mdd: float
    gap: Interval
    arms: tuple[Arms, ...]
    saturation_end: Interval
    saturation_early: Interval
    val_noise_se: float
    per_seed: dict[int, float]


def _by_seed(runs: Mapping[int, RunResult], read: Callable[[RunResult], float]) -> dict[int, float]:
    return {i: read(r) for i, r in runs.items()}


def early_saturation(run: RunResult, step: int) -> float:
    """The run's saturation (``SATURATION_METRIC``) at its trajectory point at ``step``; NaN when it has none there
    or no bounded site."""
    point = snapshots(run).get(step)
    return math.nan if point is None else value(run, SATURATION_METRIC, point, compare=False)


def validation_noise(a: RunResult, b: RunResult) -> float:
    """The standard error of ``a``'s minus ``b``'s validation loss that comes from the validation batches alone:
    the standard deviation of the per-batch differences over ``sqrt(batches)`` (NaN without two batches each)."""
    pairs = [x - y for x, y in zip(a.val_batch_losses, b.val_batch_losses, strict=False)]
    finite = [d for d in pairs if math.isfinite(d)]
    if len(finite) < 2 or len(a.val_batch_losses) != len(b.val_batch_losses):
        return math.nan
    return interval(finite).sd / math.sqrt(len(finite))


def budget_effects(design: BudgetDesign, runs: Sequence[RunResult]) -> list[BudgetEffect]:
    """Every (budget, non-reference group) comparison that has the reference's and the scheme's evaluation runs, in
    budget order, then group order."""
    out = []
    for budget in design.budgets:
        reference = design.evaluation_runs(runs, budget, design.reference)
        ref_selection = design.selection(budget, design.reference)
        for group in design.groups:
            if group.label == design.reference:
                continue
            scheme = design.evaluation_runs(runs, budget, group.label)
            if not scheme or not reference:
                continue
            selection = design.selection(budget, group.label)
            loss_a = _by_seed(scheme, lambda r: value(r, VAL_LOSS.name))
            loss_b = _by_seed(reference, lambda r: value(r, VAL_LOSS.name))
            seeds = sorted(i for i in set(loss_a) & set(loss_b) if math.isfinite(loss_a[i] - loss_b[i]))
            loss = interval([loss_a[i] - loss_b[i] for i in seeds])
            arms = tuple(Arms(name, phase_differences(scheme, reference, name)) for name in DEPTH_METRICS)
            noise = [validation_noise(scheme[i], reference[i]) for i in sorted(set(scheme) & set(reference))]
            noise = [x for x in noise if math.isfinite(x)]
            out.append(BudgetEffect(
                budget=budget,
                group=group.label,
                lr=selection.lr if selection is not None else math.nan,
                reference_lr=ref_selection.lr if ref_selection is not None else math.nan,
                loss=loss,
                mdd=minimum_detectable_difference(loss.sd, loss.n),
                gap=interval([r.val_loss - r.train_loss for r in scheme.values()]),
                arms=arms,
                saturation_end=interval(
                    [value(r, SATURATION_METRIC, compare=False) for r in scheme.values()]
                ),
                saturation_early=interval([early_saturation(r, budget.early_step) for r in scheme.values()]),
                val_noise_se=sum(noise) / len(noise) if noise else math.nan,
                per_seed={i: loss_a[i] - loss_b[i] for i in seeds},
            ))  # fmt: skip
    return out


def sign_changes(ratios: Sequence[float], intervals: Sequence[Interval]) -> list[tuple[float, float]]:
    """The budget intervals where the difference changes sign: ``(a, b)`` for each pair of budgets whose 95 %
    intervals exclude zero on opposite sides with no budget between them whose interval excludes zero (budgets
    between them whose interval covers zero are inside ``(a, b)``)."""
    decided = [
        (ratio, 1 if iv.low > 0 else -1)
        for ratio, iv in zip(ratios, intervals, strict=True)
        if iv.defined and (iv.low > 0 or iv.high < 0)
    ]
    return [(a, b) for (a, sa), (b, sb) in zip(decided, decided[1:]) if sa != sb]


@dataclass(frozen=True)
class Crossover:
    """Where a fitted line of the loss difference in ln T/P crosses zero.

    Each evaluation seed gets its own least-squares line ``d_s(x) = a_s + b_s x`` through its differences over the
    budgets (``x = ln T/P``); the fit is their mean line, and the interval is every ``x`` of the studied range where
    the seeds' 95 % t-interval of ``d(x)`` covers zero (Fieller's interval: it takes the spread of the seeds' lines,
    with no bootstrap, which over 3 seeds has 10 distinct resamples).

    Args:
        estimate: T/P where the mean line crosses zero; None when it is flat or crosses outside the studied range.
        low, high: the interval's ends in T/P within the studied range; None when the seeds' 95 % interval excludes
            zero over the whole range (every T/P studied has a decided sign, so no crossing lies inside it).
        open_low, open_high: the interval reaches that end of the studied range (the crossing may lie beyond it).
        slope: the mean line's slope (nats per unit of ln T/P).
        seeds: the seeds with a line (at least two budgets each).
        status: ``crosses`` (the mean line crosses inside the range and the interval is bounded inside it),
            ``crosses, not located`` (it crosses inside, but the interval reaches an end of the range),
            ``no sign change`` (the mean line keeps one sign over the range), or ``not enough data``.
    """

    estimate: float | None
    low: float | None
    high: float | None
    open_low: bool
    open_high: bool
    slope: float
    seeds: int
    status: str


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((v - mx) ** 2 for v in x)
    b = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx
    return my - b * mx, b


def crossover(ratios: Sequence[float], per_seed: Mapping[int, Mapping[float, float]]) -> Crossover:
    """The crossover of the differences ``per_seed[seed][ratio]`` (scheme minus reference) along ``ln ratio``
    (``Crossover``). A seed needs at least two budgets with finite differences; the fit needs two such seeds."""
    lines = []
    for diffs in per_seed.values():
        points = [(math.log(r), d) for r, d in diffs.items() if math.isfinite(d)]
        if len({p[0] for p in points}) >= 2:
            lines.append(_line([p[0] for p in points], [p[1] for p in points]))
    lo_x, hi_x = math.log(min(ratios)), math.log(max(ratios))
    n = len(lines)
    if n < 2:
        return Crossover(None, None, None, False, False, math.nan, n, "not enough data")
    a = sum(line[0] for line in lines) / n
    b = sum(line[1] for line in lines) / n
    saa = sum((line[0] - a) ** 2 for line in lines) / (n - 1)
    sbb = sum((line[1] - b) ** 2 for line in lines) / (n - 1)
    sab = sum((line[0] - a) * (line[1] - b) for line in lines) / (n - 1)
    k = float(_scipy_stats.t.ppf(1 - ALPHA / 2, n - 1)) ** 2 / n
    # d(x) covers zero where (a + b x)^2 <= k var(x), var(x) = saa + 2 sab x + sbb x^2: A x^2 + B x + C <= 0
    qa, qb, qc = b * b - k * sbb, 2 * (a * b - k * sab), a * a - k * saa

    def covers(x: float) -> bool:
        return qa * x * x + qb * x + qc <= 0

    roots: list[float] = []
    if qa != 0:
        disc = qb * qb - 4 * qa * qc
        if disc >= 0:
            roots = sorted(((-qb - math.sqrt(disc)) / (2 * qa), (-qb + math.sqrt(disc)) / (2 * qa)))
    elif qb != 0:
        roots = [-qc / qb]
    # the covered set within [lo_x, hi_x]: its ends are range ends or roots inside the range
    edges = sorted({lo_x, hi_x, *[r for r in roots if lo_x < r < hi_x]})
    covered = [(u, v) for u, v in zip(edges, edges[1:]) if covers((u + v) / 2)]
    if not covered and covers(lo_x):
        covered = [(lo_x, lo_x)]
    estimate = -a / b if b != 0 else math.nan
    inside = math.isfinite(estimate) and lo_x <= estimate <= hi_x
    if not covered:
        low = high = None
        open_low = open_high = False
    else:
        low, high = math.exp(covered[0][0]), math.exp(covered[-1][1])
        open_low, open_high = covered[0][0] <= lo_x, covered[-1][1] >= hi_x
    if not inside:
        status = "no sign change"
    elif open_low or open_high:
        status = "crosses, not located"
    else:
        status = "crosses"
    return Crossover(math.exp(estimate) if inside else None, low, high, open_low, open_high, b, n, status)


@dataclass(frozen=True)
class SaturationCell:
    """One (scheme, budget) cell the saturation rule is scored on.

    Args:
        group, budget: the cell.
        early: the scheme's mean saturation at the budget's early step over its evaluation seeds.
        loss: its validation-loss difference to the reference.
        predicted: ``-1`` (lower loss: bounding helps) when ``early >= SATURATION_CUT``, else ``+1``.
        observed: the sign of ``loss``'s mean.
        decided: ``loss``'s 95 % interval excludes zero.
    """

    group: str
    budget: TokenBudget
    early: float
    loss: Interval
    predicted: int
    observed: int
    decided: bool

    @property
    def correct(self) -> bool:
        return self.predicted == self.observed


@dataclass(frozen=True)
class SaturationRule:
    """The rule's score over the cells that have a bounded site: its accuracy over every cell and over the cells
    whose loss difference the seeds decide."""

    cells: tuple[SaturationCell, ...]

    @property
    def accuracy(self) -> float:
        return sum(c.correct for c in self.cells) / len(self.cells) if self.cells else math.nan

    @property
    def decided(self) -> tuple[SaturationCell, ...]:
        return tuple(c for c in self.cells if c.decided)

    @property
    def decided_accuracy(self) -> float:
        cells = self.decided
        return sum(c.correct for c in cells) / len(cells) if cells else math.nan

    @property
    def wrong(self) -> tuple[SaturationCell, ...]:
        return tuple(c for c in self.cells if not c.correct)


def saturation_rule(effects: Sequence[BudgetEffect], cut: float = SATURATION_CUT) -> SaturationRule:
    """The early-saturation rule scored on every effect with a finite early saturation and a loss difference (a
    scheme without a bounded site has no saturation, so no cell)."""
    cells = []
    for e in effects:
        early = e.saturation_early.mean
        if e.saturation_early.n == 0 or not math.isfinite(early) or e.loss.n == 0 or e.loss.mean == 0:
            continue
        decided = e.loss.defined and (e.loss.low > 0 or e.loss.high < 0)
        cells.append(
            SaturationCell(
                e.group, e.budget, early, e.loss, -1 if early >= cut else 1, 1 if e.loss.mean > 0 else -1, decided
            )  # fmt: skip
        )
    return SaturationRule(tuple(cells))

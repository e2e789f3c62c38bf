"""The per-scheme columns both reports share: a row is one group's runs over its seeds at one rate (``SeedRuns``),
and a column writes one statistic of those runs (``bhyt_pl.study.report.markdown``).

The columns take one column per summary of every registered per-layer statistic (``bhyt_pl.callbacks.layer_stats``):
a statistic declared there shows here without an edit. A cell is the mean [95% t-interval] (min-max) over the seeds,
on the scale the claims test: a statistic compared as an ln ratio (a magnitude, a variance) is a geometric mean with
its interval back-transformed from the ln scale, so no interval on a positive quantity goes below 0; diverged and
failed runs are left out of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from bhyt_pl.callbacks.layer_stats import ByScheme
from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.metrics import Metric, metrics, value
from bhyt_pl.study.protocol.spec import RunResult, RunStatus
from bhyt_pl.study.report.markdown import Column, ci, geometric_ci, num

__all__ = [
    "RUN_VALUES",
    "SECTIONS",
    "SeedRuns",
    "diverged_cell",
    "finite_mean",
    "geometric_column",
    "matched_columns",
    "per_seed",
    "run_value",
    "seed_column",
    "statistic_columns",
]


# ----------------------------------------------------------------------------- per-run values
def finite_mean(values: Iterable[float]) -> float:
    """The mean of the finite values (None, NaN and inf left out); NaN when none is."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _stability_last(r: RunResult, key: str) -> float:
    steps = r.stability.get("steps", []) if r.stability else []
    last = steps[-1].get(key) if steps else None
    return float(last) if last is not None else math.nan


def _stability_total(r: RunResult, key: str) -> float:
    return float(r.stability.get(key, math.nan)) if r.stability else math.nan


RUN_VALUES: dict[str, Callable[[RunResult], float]] = {
    "train_loss": lambda r: r.train_loss,
    "loss_spikes": lambda r: _stability_total(r, "loss_spikes"),
    "grad_norm_spikes": lambda r: _stability_total(r, "grad_norm_spikes"),
    "max_grad_layer": lambda r: _stability_last(r, "max_grad_layer"),
    "last_attn_entropy": lambda r: _stability_last(r, "last_attn_entropy"),
}
"""Per-run scalars of the tables beyond the metrics (``bhyt_pl.study.protocol.metrics``): the training loss and
StabilityMonitor's columns at its last logging step."""


def run_value(r: RunResult, name: str) -> float:
    """``name`` of run ``r`` at the end of training on its own scale (a metric's ln scale is for comparisons)."""
    return RUN_VALUES[name](r) if name in RUN_VALUES else value(r, name, compare=False)


def per_seed(runs: Sequence[RunResult], name: str) -> dict[int, float]:
    """``{seed index: value}``; NaN for runs that diverged or failed (no pair in comparisons)."""
    return {r.spec.seed_index: (run_value(r, name) if r.status == RunStatus.OK else math.nan) for r in runs}


def diverged_cell(r: RunResult) -> str:
    if r.status == RunStatus.DIVERGED:
        return f"yes, step {r.diverged_step} (loss {num(r.diverged_loss)})"
    if r.status == RunStatus.ERROR:
        return f"error: {r.error}"
    return "no"


# ----------------------------------------------------------------------------- per-scheme tables
@dataclass(frozen=True)
class SeedRuns:
    """One row of a per-scheme table: a group's runs over its evaluation seeds at one rate.

    Args:
        label: the row's scheme cell (the group, flagged where the table flags edges).
        lr: the rate.
        runs: the evaluation-seed runs, by seed index.
    """

    label: str
    lr: float
    runs: list[RunResult]

    @property
    def ok(self) -> list[RunResult]:
        return [r for r in self.runs if r.status == RunStatus.OK]


def seed_column(header: str, name: str, digits: int = 3) -> Column[SeedRuns]:
    """The mean [95% CI] (min-max) of ``name`` over a row's seeds."""
    return Column(header, lambda row: ci(stats.interval(per_seed(row.runs, name).values()), digits))


def geometric_column(header: str, name: str, digits: int = 3) -> Column[SeedRuns]:
    """The geometric mean [95% CI back-transformed from the ln scale] (min-max) of a positive ``name`` over a row's
    seeds: the scale of its claims (ln ratios), and an interval that cannot go below 0."""
    return Column(header, lambda row: geometric_ci(stats.geometric_mean(per_seed(row.runs, name).values()), digits))


def _metric_column(m: Metric) -> Column[SeedRuns]:
    """A summary's column on its comparison scale: geometric for a metric compared as an ln ratio."""
    return geometric_column(m.summary.header, m.name) if m.log else seed_column(m.summary.header, m.name)


def _scheme_metric_column(m: Metric) -> Column[SeedRuns]:
    """A statistic the scheme itself reports (``ByScheme``): ``-`` for a group whose runs do not record it (a scheme
    without such sites), not "n/a"."""
    aggregated = _metric_column(m)

    def cell(row: SeedRuns) -> str:
        present = any(math.isfinite(run_value(r, m.name)) for r in row.ok)
        return aggregated.cell(row) if present else "-"

    return Column(m.summary.header, cell)


SECTIONS: dict[str, tuple[str, ...]] = {
    "last layer": ("last",),
    "growth": ("growth", "growth_slope"),
    "over layers": ("layer_mean",),
}
"""The per-scheme tables' groups of statistic columns, by summary kind: in each, statistic by statistic in
registration order, each statistic's summaries in declaration order."""


def statistic_columns(section: str, claimable_only: bool = False) -> list[Column[SeedRuns]]:
    """One column per summary of ``SECTIONS[section]``'s kinds that has a header (``claimable_only``: and a
    margin, the summaries a claim can test)."""
    kinds = SECTIONS[section]
    columns = []
    for m in metrics().values():
        summary = m.summary
        if summary is None or summary.kind not in kinds or not summary.header:
            continue
        if claimable_only and summary.margin is None:
            continue
        is_scheme = isinstance(m.statistic.measure, ByScheme)
        columns.append(_scheme_metric_column(m) if is_scheme else _metric_column(m))
    return columns


def matched_columns() -> list[Column[SeedRuns]]:
    """The per-scheme table at the matched rates: the validation loss and every summary a claim can test."""
    return [
        Column("scheme", lambda row: row.label),
        Column("lr", lambda row: f"{row.lr:g}"),
        Column("seeds ok", lambda row: f"{len(row.ok)}/{len(row.runs)}"),
        seed_column("val loss", "val_loss", 4),
        *statistic_columns("last layer", claimable_only=True),
        *statistic_columns("growth", claimable_only=True),
    ]

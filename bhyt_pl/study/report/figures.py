"""The study report's figures: plain ``matplotlib.figure.Figure`` objects saved with the Agg canvas (no pyplot
state). Seed bands span the min-max over seeds around the mean; one colour per scheme group in every figure.

The depth profile has one panel per statistic the study records along training and measures on blocks, the
trajectories one panel per statistic summary declared with a panel title (``bhyt_pl.callbacks.layer_stats``):
a statistic declared there is drawn here without an edit. A figure of scheme groups takes them as ``FigureGroup``
entries, each with the runs it shows: the exploration picks them from its design, the confirmation from its plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bhyt_pl.callbacks.layer_stats import KINDS, LayerStatistic, OnBlockOutput, Summary, layer_profile
from bhyt_pl.study.protocol.claims import ClaimResult
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns
from bhyt_pl.study.protocol.metrics import metrics, trajectory_statistics
from bhyt_pl.study.protocol.plan import SELECTION_SEED
from bhyt_pl.study.protocol.spec import RunResult, RunStatus
from bhyt_pl.study.report.tables import scheme_label, sweep_depth

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "FigureGroup",
    "claims_figure",
    "depth_profile_figure",
    "importance_figure",
    "loss_figure",
    "lr_figure",
    "profile_statistics",
    "save_figure",
    "sweep_figure",
    "trajectory_figure",
    "trajectory_panels",
]


def save_figure(figure: Figure, path: Path) -> Path:
    """Write a ``Figure`` as PNG with the Agg canvas (no GUI, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


@dataclass(frozen=True)
class FigureGroup:
    """One scheme group as a figure draws it: its label (the legend's entry) and the runs it shows, by seed index.
    A figure takes its groups in order and gives each the colour of its position, so one sequence of groups keeps
    one colour per group across figures."""

    label: str
    runs: Sequence[RunResult]


def _color(groups: Sequence[FigureGroup], label: str) -> tuple[float, float, float, float]:
    """One colour per scheme group, the same in every panel and figure."""
    from matplotlib import colormaps

    labels = [g.label for g in groups]
    palette = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return palette(labels.index(label) % palette.N)


def _band(ax: Axes, x: Sequence[float], series: list[list[float]], label: str, color: object = None) -> None:
    """Mean over seeds with a min-max band."""
    import numpy as np

    n = min(len(s) for s in series)
    arr = np.array([s[:n] for s in series], dtype=float)
    if not np.isfinite(arr).any():
        return
    with np.errstate(all="ignore"):
        mean = np.nanmean(arr, axis=0)
        low, high = np.nanmin(arr, axis=0), np.nanmax(arr, axis=0)
    (line,) = ax.plot(list(x)[:n], mean, marker="o", markersize=2, linewidth=1.2, label=label, color=color)
    ax.fill_between(list(x)[:n], low, high, color=line.get_color(), alpha=0.2, linewidth=0)


def _grid(figure: Figure, n: int, rows: int = 2, by_column: bool = False) -> list[Axes]:
    """``n`` panels on ``rows`` rows (one row for a single panel), filled row by row or column by column; spare
    axes hidden."""
    import numpy as np

    rows = min(rows, max(1, n))
    columns = max(1, math.ceil(n / rows))
    axes = np.atleast_2d(figure.subplots(rows, columns, squeeze=False))
    ordered = list((axes.T if by_column else axes).ravel())
    for ax in ordered[n:]:
        ax.set_visible(False)
    return ordered[:n]


# ----------------------------------------------------------------------------- depth statistics
def profile_statistics() -> tuple[LayerStatistic, ...]:
    """The depth profile's panels: the statistics recorded along training that are measured on block outputs."""
    return tuple(s for s in trajectory_statistics() if isinstance(s.measure, OnBlockOutput))


def depth_profile_figure(groups: Sequence[FigureGroup], title: str) -> Figure:
    """Paper Figure 3 and its robust variants against depth at the end (``profile_statistics``, log scale, panels
    filled column by column over two rows): each group's finished runs, mean over seeds with a min-max band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = profile_statistics()
    figure = Figure(figsize=(6.5 * max(1, math.ceil(len(panels) / 2)), 8), layout="constrained")
    axes = _grid(figure, len(panels), by_column=True)
    for ax, stat in zip(axes, panels, strict=True):
        for g in groups:
            seeds = [r for r in g.runs if r.status == RunStatus.OK]
            series = [layer_profile(r.depth_final, stat.name) for r in seeds]
            series = [s for s in series if s]
            if series:
                _band(ax, range(1, len(series[0]) + 1), series, g.label, _color(groups, g.label))
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer (block output)")
        ax.set_title(stat.name.replace("_", " "))
        ax.grid(alpha=0.3, which="both")
    if axes and axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(title)
    return figure


def trajectory_panels() -> list[tuple[LayerStatistic, Summary]]:
    """The trajectory figure's panels: every statistic summary declared with a panel title, kind by kind (last
    layer, growth, slope, mean over layers), statistic by statistic."""
    titled = [(m.statistic, m.summary) for m in metrics().values() if m.summary is not None and m.summary.title]
    return sorted(titled, key=lambda pair: list(KINDS).index(pair[1].kind))


def trajectory_figure(groups: Sequence[FigureGroup], title: str) -> Figure:
    """Every titled statistic summary (``trajectory_panels``) against the optimizer step: each group's finished
    runs, mean over seeds with a min-max band; last-layer values on a log scale."""
    from matplotlib.figure import Figure

    panels = trajectory_panels()
    figure = Figure(figsize=(6.5 * max(1, math.ceil(len(panels) / 2)), 8), layout="constrained")
    axes = _grid(figure, len(panels))
    for ax, (stat, summary) in zip(axes, panels, strict=True):
        for g in groups:
            seeds = [r for r in g.runs if r.status == RunStatus.OK and r.trajectory]
            if not seeds:
                continue
            steps = [p["step"] for p in seeds[0].trajectory]
            series = [[summary.value(stat.profile(p, r.dim)) for p in r.trajectory] for r in seeds]
            _band(ax, steps, series, g.label, _color(groups, g.label))
        if summary.log:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_title(summary.title, fontsize=9)
        ax.grid(alpha=0.3)
    if axes and axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(title)
    return figure


# ----------------------------------------------------------------------------- selection and training
def lr_figure(runs: StudyRuns, design: StudyDesign, max_loss: float) -> Figure:
    """Validation loss against learning rate on the selection seed, one line per candidate; a diverged run is an
    'x' at the top of the plot (the divergence edge)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    first = [r for r in runs if r.spec.seed_index == SELECTION_SEED]
    finite = [r.val_loss for r in first if r.status == RunStatus.OK and math.isfinite(r.val_loss)]
    top = max(finite) + 0.1 if finite else max_loss
    for g in design.groups:
        for v in g.candidates:
            tried = sorted(
                (r for r in first if r.spec.group == g.label and r.spec.candidate == v.label),
                key=lambda r: r.spec.lr,
            )
            if not tried:
                continue
            ok = [r for r in tried if r.status == RunStatus.OK]
            (line,) = ax.plot(
                [r.spec.lr for r in ok], [r.val_loss for r in ok], marker="o", markersize=3, label=v.label
            )
            bad = [r.spec.lr for r in tried if r.status != RunStatus.OK]
            if bad:
                ax.plot(bad, [top] * len(bad), "x", color=line.get_color(), markersize=8)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (first seed)")
    ax.set_title("LR sensitivity (x at the top: diverged)")
    ax.grid(alpha=0.3, which="both")
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


def importance_figure(groups: Sequence[FigureGroup]) -> Figure:
    """Validation-loss increase when each block alone is replaced by the identity, each group's finished runs,
    mean with a seed band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(9, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in groups:
        seeds = [r for r in g.runs if r.status == RunStatus.OK and r.importance]
        if seeds:
            x = range(1, len(seeds[0].importance) + 1)
            _band(ax, x, [r.importance for r in seeds], g.label, _color(groups, g.label))
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block replaced by the identity")
    ax.set_ylabel("validation loss increase (nats)")
    ax.set_title("layer importance")
    ax.grid(alpha=0.3, which="both")
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


def loss_figure(groups: Sequence[FigureGroup], title: str) -> Figure:
    """Training loss against step over each group's finished runs (mean with a min-max band)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in groups:
        seeds = [r for r in g.runs if r.status == RunStatus.OK and r.losses]
        if seeds:
            steps = [s for s, _ in seeds[0].losses]
            _band(ax, steps, [[v for _, v in r.losses] for r in seeds], g.label, _color(groups, g.label))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


# ----------------------------------------------------------------------------- claims over training
def claims_figure(items: Sequence[ClaimResult]) -> Figure:
    """Each claim's difference (mean with the interval its rule decides by: 95 %, 90 % for a TOST) against training
    tokens, one panel per claim and one line per rate; the dashed line is 0, dotted lines the margin."""
    from matplotlib.figure import Figure

    panels = [c for c in items if any(t.over_training for t in c.tests)]
    columns = 4
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(4 * columns, 2.6 * rows + 0.5), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, c in zip(axes, panels, strict=False):
        for t in c.tests:
            pts = [p for p in t.over_training if math.isfinite(p["mean"])]
            if not pts:
                continue
            x = [max(p["tokens"], 1) for p in pts]
            (line,) = ax.plot(x, [p["mean"] for p in pts], marker="o", markersize=2, label=f"lr {t.rate}")
            low = [p["low"] if math.isfinite(p["low"]) else p["mean"] for p in pts]
            high = [p["high"] if math.isfinite(p["high"]) else p["mean"] for p in pts]
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.axhline(0, color="black", linestyle="--", linewidth=0.8)
        if c.spec.margin_value:
            for m in (c.spec.margin_value, -c.spec.margin_value):
                ax.axhline(m, color="grey", linestyle=":", linewidth=0.8)
        positive = [p["tokens"] for t in c.tests for p in t.over_training if p["tokens"] > 0]
        ax.set_xscale("symlog", linthresh=max(1, min(positive, default=1)))
        ax.set_title(f"{c.target} - {c.baseline}: {c.spec.metric}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=5)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    figure.supxlabel("training tokens")
    figure.suptitle(
        "claims over training: target - baseline, mean and 95% CI (90% for ~) over evaluation seeds; uncorrected, "
        "descriptive",
        fontsize=10,
    )
    return figure


# ----------------------------------------------------------------------------- the stability sweep
def sweep_figure(results: Sequence[RunResult], max_loss: float) -> Figure:
    """The stability grid: one panel per scheme, depth (rows) x learning rate (columns), coloured by the
    final training loss; diverged cells are black with the step of divergence. First seed only."""
    import numpy as np
    from matplotlib.figure import Figure

    results = [r for r in results if r.spec.seed_index == 0]
    schemes = list(dict.fromkeys(scheme_label(r) for r in results))
    depths = sorted({sweep_depth(r) for r in results})
    lrs = sorted({r.spec.lr for r in results})
    finite = [r.train_loss for r in results if r.status == RunStatus.OK and math.isfinite(r.train_loss)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, max_loss)
    if vmax <= vmin:
        vmax = vmin + 1e-6
    columns = min(4, len(schemes))
    rows = math.ceil(len(schemes) / columns)
    figure = Figure(figsize=(3.2 * columns + 1, 2.6 * rows + 0.6), layout="constrained")
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    image = None
    for ax, scheme in zip(axes, schemes, strict=False):
        grid = np.full((len(depths), len(lrs)), np.nan)
        labels = [["" for _ in lrs] for _ in depths]
        for r in results:
            if scheme_label(r) != scheme:
                continue
            i, j = depths.index(sweep_depth(r)), lrs.index(r.spec.lr)
            if r.status == RunStatus.OK:
                grid[i, j] = r.train_loss
                labels[i][j] = f"{r.train_loss:.2f}"
            else:
                labels[i][j] = f"div@{r.diverged_step}" if r.status == RunStatus.DIVERGED else "error"
        ax.set_facecolor("black")  # NaN cells (diverged or failed) show the background
        image = ax.imshow(grid, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto", origin="lower")
        for i in range(len(depths)):
            for j in range(len(lrs)):
                color = "white" if not np.isfinite(grid[i, j]) or grid[i, j] < (vmin + vmax) / 2 else "black"
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_yticks(range(len(depths)), [str(d) for d in depths], fontsize=7)
        ax.set_xlabel("learning rate", fontsize=8)
        ax.set_ylabel("layers", fontsize=8)
        ax.set_title(scheme, fontsize=9)
    for ax in axes[len(schemes) :]:
        ax.set_visible(False)
    if image is not None:
        figure.colorbar(image, ax=list(axes[: len(schemes)]), label="final training loss", shrink=0.8)
    figure.suptitle(f"stability grid (black: diverged, loss NaN/inf or > {max_loss:g})", fontsize=10)
    return figure

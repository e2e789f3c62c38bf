"""The study's report: markdown tables and matplotlib figures from a list of ``RunResult``.

Figures are plain ``matplotlib.figure.Figure`` objects saved with the Agg canvas (no pyplot state).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bhyt_pl.study.runner import RunResult, layer_series

__all__ = [
    "TABLE_COLUMNS",
    "bound_table",
    "depth_figure",
    "loss_figure",
    "orderings",
    "results_table",
    "save_figure",
    "sweep_figure",
    "sweep_table",
]

TABLE_COLUMNS = (
    "scheme",
    "status",
    "steps",
    "train loss",
    "val loss",
    "val ppl",
    "tokens/s",
    "last-layer magnitude init",
    "last-layer magnitude end",
    "last-layer variance init",
    "last-layer variance end",
    "diverged",
)
"""Columns of the depth-study table (``results_table``)."""


def _num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    magnitude = abs(value)
    if magnitude >= 1e5 or (0 < magnitude < 1e-3):
        return f"{value:.{digits - 1}e}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if magnitude < 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _diverged_cell(r: RunResult) -> str:
    if r.status == "diverged":
        return f"yes, step {r.diverged_step} (loss {_num(r.diverged_loss)})"
    if r.status == "error":
        return f"error: {r.error}"
    return "no"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    lines = [_row(header), _row(["---"] * len(header))]
    lines += [_row(r) for r in rows]
    return "\n".join(lines)


def results_table(results: Sequence[RunResult]) -> str:
    """The depth-study table (``TABLE_COLUMNS``), one row per run, in run order."""
    rows = [
        [
            r.spec.label,
            r.status,
            f"{r.steps_done}/{r.spec.steps}",
            _num(r.train_loss),
            _num(r.val_loss),
            _num(r.val_perplexity, 4),
            _num(r.tokens_per_sec, 4),
            _num(r.last_layer("magnitude", "init")),
            _num(r.last_layer("magnitude", "final")),
            _num(r.last_layer("variance", "init")),
            _num(r.last_layer("variance", "final")),
            _diverged_cell(r),
        ]
        for r in results
    ]
    return _table(TABLE_COLUMNS, rows)


def bound_table(results: Sequence[RunResult]) -> str:
    """The theorem condition ``lambda/kappa < 1/sqrt(L)`` of every BHyT run, as the code computed it."""
    header = (
        "run",
        "L",
        "kappa",
        "1/sqrt(L)",
        "lambda_attn/kappa (init)",
        "lambda_mlp/kappa (init)",
        "holds at init",
        "max learned lambda_attn/kappa",
        "max learned lambda_mlp/kappa",
        "holds for learned",
    )
    rows = []
    for r in results:
        b = r.variance_bound
        if not b:
            continue
        k = b["kappa"]
        rows.append(
            [
                r.spec.label,
                b["n_layers"],
                _num(k),
                _num(b["threshold"]),
                _num(b["lambda_attn"] / k),
                _num(b["lambda_mlp"] / k),
                "yes" if b["at_init"]["all"] else "no",
                _num(b["learned_max_lambda_attn"] / k),
                _num(b["learned_max_lambda_mlp"] / k),
                "yes" if b["learned_holds"] else "no",
            ]
        )
    return _table(header, rows) if rows else "(no BHyT run)"


def orderings(results: Sequence[RunResult], reference: str = "rmsnorm") -> dict[str, Any]:
    """Facts the paper's claims are checked against: schemes sorted by last-layer magnitude and variance
    at the end (largest first, diverged and failed runs left out) and each run's loss minus the reference's."""
    ok = [r for r in results if r.status == "ok"]
    facts: dict[str, Any] = {}
    for stat in ("magnitude", "variance"):
        ranked = sorted(ok, key=lambda r: -r.last_layer(stat))
        facts[f"{stat}_order"] = [(r.spec.label, r.last_layer(stat)) for r in ranked]
    ref = next((r for r in ok if r.spec.label == reference), None)
    if ref is not None:
        facts["val_loss_minus_reference"] = {r.spec.label: r.val_loss - ref.val_loss for r in ok}
        facts["train_loss_minus_reference"] = {r.spec.label: r.train_loss - ref.train_loss for r in ok}
    return facts


# ----------------------------------------------------------------------------- figures
def save_figure(figure: Any, path: Path) -> Path:
    """Write a ``Figure`` as PNG with the Agg canvas (no GUI, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def depth_figure(results: Sequence[RunResult], which: str, title: str) -> Any:
    """Magnitude and variance of every block output against depth, one line per run (paper Figure 3)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    axes = figure.subplots(1, 2)
    for ax, stat in zip(axes, ("magnitude", "variance"), strict=True):
        for r in results:
            values = layer_series(r.depth_init if which == "init" else r.depth_final, stat)
            if not values or not any(math.isfinite(v) for v in values):
                continue
            suffix = "" if r.status == "ok" else f" ({r.status})"
            ax.plot(range(1, len(values) + 1), values, marker="o", markersize=2.5, label=r.spec.label + suffix)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer (block output)")
        ax.set_ylabel(f"{stat} (log scale)")
        ax.set_title(stat)
        ax.grid(alpha=0.3, which="both")
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    figure.suptitle(title)
    return figure


def loss_figure(results: Sequence[RunResult], title: str) -> Any:
    """Training loss against optimizer step, one line per run; diverged runs end at their divergence."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.subplots()
    for r in results:
        points = [(s, v) for s, v in r.losses if math.isfinite(v)]
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], linewidth=1, label=r.spec.label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    return figure


# ----------------------------------------------------------------------------- sweep
def sweep_table(results: Sequence[RunResult]) -> str:
    """One row per (scheme, depth): the final training loss at each learning rate, or where it diverged."""
    lrs = sorted({r.spec.lr for r in results})
    cells: dict[tuple[str, int], dict[float, str]] = {}
    for r in results:
        key = (_scheme_label(r), r.n_layers or r.spec.overrides.get("n_layers", 0))
        if r.status == "diverged":
            text = f"**diverged** @{r.diverged_step}"
        elif r.status == "error":
            text = "error"
        else:
            text = _num(r.train_loss)
        cells.setdefault(key, {})[r.spec.lr] = text
    header = ["scheme", "layers"] + [f"lr {lr:g}" for lr in lrs]
    rows = [[s, str(d)] + [c.get(lr, "-") for lr in lrs] for (s, d), c in cells.items()]
    return _table(header, rows)


def _scheme_label(r: RunResult) -> str:
    return r.spec.label.split("@", 1)[0]


def sweep_figure(results: Sequence[RunResult], max_loss: float) -> Any:
    """The stability grid: one panel per scheme, depth (rows) x learning rate (columns), coloured by the
    final training loss; diverged cells are black with the step of divergence."""
    import numpy as np
    from matplotlib.figure import Figure

    schemes = list(dict.fromkeys(_scheme_label(r) for r in results))
    depths = sorted({r.n_layers or r.spec.overrides.get("n_layers", 0) for r in results})
    lrs = sorted({r.spec.lr for r in results})
    finite = [r.train_loss for r in results if r.status == "ok" and math.isfinite(r.train_loss)]
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
            if _scheme_label(r) != scheme:
                continue
            i, j = depths.index(r.n_layers or r.spec.overrides.get("n_layers", 0)), lrs.index(r.spec.lr)
            if r.status == "ok":
                grid[i, j] = r.train_loss
                labels[i][j] = f"{r.train_loss:.2f}"
            else:
                labels[i][j] = f"div@{r.diverged_step}" if r.status == "diverged" else "error"
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

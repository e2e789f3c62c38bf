"""The study's report: markdown tables and matplotlib figures from a list of ``RunResult`` and the protocol's
design (each group's selection, the matched rates).

Seed aggregation and verdicts come from ``bhyt_pl.study.stats``; the claims are the rows of
``bhyt_pl.study.claims.CLAIMS`` (docs/method.md, section 10), evaluated there; this module only lays them out.
Figures are plain ``matplotlib.figure.Figure`` objects saved with
the Agg canvas (no pyplot state); seed bands span the min-max over seeds around the mean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bhyt_pl.callbacks.layer_metrics import layer_series, split_layer_key
from bhyt_pl.study import stats
from bhyt_pl.study.claims import MARGINS, ClaimResult, ClaimSpec, evaluate
from bhyt_pl.study.design import RunKey, SchemeGroup, StudyDesign, StudyRuns, rate_key
from bhyt_pl.study.metrics import LOG_METRICS, final_snapshot
from bhyt_pl.study.metrics import METRICS as CLAIM_METRICS
from bhyt_pl.study.metrics import value as ln_value
from bhyt_pl.study.plan import SELECTION_SEED
from bhyt_pl.study.results import StudyRecord
from bhyt_pl.study.runner import RunResult

__all__ = [
    "GROUP_COLUMNS",
    "MATCHED_COLUMNS",
    "best_runs",
    "bound_table",
    "claims_figure",
    "design_table",
    "detail_table",
    "group_table",
    "growth_words",
    "lr_table",
    "matched_table",
    "per_seed",
    "save_figure",
    "summary_table",
    "sweep_figure",
    "sweep_table",
    "training_table",
    "write_report",
]

GROUP_COLUMNS = (
    "scheme",
    "candidate",
    "lr",
    "seeds ok",
    "val loss",
    "train loss",
    "last-layer magnitude (mean token)",
    "median token",
    "per coordinate (/sqrt d)",
    "last-layer variance",
    "magnitude w/o top-2 channels",
    "ln magnitude growth L/4..L",
    "ln magnitude slope/layer L/4..L",
    "ln variance growth L/4..L",
    "loss / grad-norm spikes",
    "layer of max grad norm",
    "last-layer attn entropy",
    "tanh saturation",
)
"""Columns of the per-scheme table (``group_table``): mean [95% CI] (min-max) over seeds where numeric."""


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


# ----------------------------------------------------------------------------- figures
def save_figure(figure: Any, path: Path) -> Path:
    """Write a ``Figure`` as PNG with the Agg canvas (no GUI, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


# ----------------------------------------------------------------------------- sweep
def sweep_table(results: Sequence[RunResult]) -> str:
    """One row per (scheme, depth): the final training loss at each learning rate (one value per seed, in
    seed order), or where it diverged."""
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
        cell = cells.setdefault(key, {})
        cell[r.spec.lr] = f"{cell[r.spec.lr]} / {text}" if r.spec.lr in cell else text  # one value per seed
    header = ["scheme", "layers"] + [f"lr {lr:g}" for lr in lrs]
    rows = [[s, str(d)] + [c.get(lr, "-") for lr in lrs] for (s, d), c in cells.items()]
    return _table(header, rows)


def _scheme_label(r: RunResult) -> str:
    return r.spec.candidate or r.spec.label.split("@", 1)[0]


def sweep_figure(results: Sequence[RunResult], max_loss: float) -> Any:
    """The stability grid: one panel per scheme, depth (rows) x learning rate (columns), coloured by the
    final training loss; diverged cells are black with the step of divergence. First seed only."""
    import numpy as np
    from matplotlib.figure import Figure

    results = [r for r in results if r.spec.seed_index == 0]
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


# ----------------------------------------------------------------------------- per-run values
def _final_point(r: RunResult) -> dict[str, Any]:
    return r.trajectory[-1] if r.trajectory else {}


def _last(values: Sequence[float]) -> float:
    return values[-1] if values else math.nan


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _stability_last(r: RunResult, key: str) -> float:
    steps = r.stability.get("steps", []) if r.stability else []
    value = steps[-1].get(key) if steps else None
    return float(value) if value is not None else math.nan


RUN_METRICS: dict[str, Callable[[RunResult], float]] = {
    "val_loss": lambda r: r.val_loss,
    "train_loss": lambda r: r.train_loss,
    "magnitude_top2_removed": lambda r: r.last_layer("magnitude_top2_removed"),
    "saturation": lambda r: _mean([v for v in _final_point(r).get("saturation", [])]),
    "loss_spikes": lambda r: float(r.stability.get("loss_spikes", math.nan)) if r.stability else math.nan,
    "grad_norm_spikes": lambda r: float(r.stability.get("grad_norm_spikes", math.nan)) if r.stability else math.nan,
    "max_grad_layer": lambda r: _stability_last(r, "max_grad_layer"),
    "last_attn_entropy": lambda r: _stability_last(r, "last_attn_entropy"),
}
"""Per-run scalars of the tables beyond the claim metrics (``bhyt_pl.study.metrics.METRICS``)."""

METRICS = {**{k: (lambda r, k=k: CLAIM_METRICS[k][1](final_snapshot(r), r.dim)) for k in CLAIM_METRICS}, **RUN_METRICS}
"""Every per-run scalar the tables aggregate over seeds, on its own scale (end of training)."""


def per_seed(runs: Sequence[RunResult], metric: str) -> dict[int, float]:
    """``{seed index: value}``; NaN for runs that diverged or failed (no pair in comparisons)."""
    return {r.spec.seed_index: (METRICS[metric](r) if r.status == "ok" else math.nan) for r in runs}


def _ci(iv: stats.Interval, digits: int = 3) -> str:
    if iv.n == 0:
        return "n/a"
    if not iv.defined:
        return f"{_num(iv.mean, digits)} (n={iv.n})"
    spread = f"({_num(iv.minimum, digits)}-{_num(iv.maximum, digits)})"
    return f"{_num(iv.mean, digits)} [{_num(iv.low, digits)}, {_num(iv.high, digits)}] {spread}"


# ----------------------------------------------------------------------------- groups at their best rate
def best_runs(runs: StudyRuns, design: StudyDesign, group: str) -> list[RunResult]:
    """The evaluation-seed runs of ``group``'s kept candidate at its best rate (empty before its selection)."""
    return design.evaluation_runs(runs, group)


def depth_runs(runs: StudyRuns, design: StudyDesign, group: str) -> list[RunResult]:
    """The runs a depth figure shows for ``group``: at the highest matched rate when there is one (depth statistics
    grow with the learning rate, so profiles at different rates would compare the rates), else at its best rate."""
    return design.evaluation_runs(runs, group, design.depth_lr)


def depth_runs_words(design: StudyDesign) -> str:
    """Where ``depth_runs`` reads, for a figure's title."""
    return (
        f"every scheme at lr {max(design.matched_lrs):g} (matched)"
        if design.matched_lrs
        else "each scheme at its best lr"
    )


def _flag(design: StudyDesign, group: str) -> str:
    """The group's label, flagged when its best rate is still at an edge of the rates it tried."""
    s = design.selections.get(group)
    return f"{group} (edge: {s.edge})" if s is not None and s.edge else group


def group_table(runs: StudyRuns, design: StudyDesign) -> str:
    """One row per scheme group (``GROUP_COLUMNS``) over its evaluation seeds at its best rate."""
    rows = []
    for g in design.groups:
        seeds = best_runs(runs, design, g.label)
        if not seeds:
            rows.append([_flag(design, g.label), "selection unfinished"] + ["-"] * (len(GROUP_COLUMNS) - 2))
            continue
        ok = [r for r in seeds if r.status == "ok"]

        def agg(metric: str, digits: int = 3) -> str:
            return _ci(stats.interval(per_seed(seeds, metric).values()), digits)

        loss_spikes = _mean([METRICS["loss_spikes"](r) for r in ok])
        spikes = f"{_num(loss_spikes)} / {_num(_mean([METRICS['grad_norm_spikes'](r) for r in ok]))}"
        layers = ", ".join(
            str(int(v)) if math.isfinite(v) else "-" for v in (METRICS["max_grad_layer"](r) for r in seeds)
        )
        rows.append(
            [
                _flag(design, g.label),
                seeds[0].spec.candidate,
                f"{seeds[0].spec.lr:g}",
                f"{len(ok)}/{len(seeds)}"
                + (
                    ""
                    if len(ok) == len(seeds)
                    else " (" + ", ".join(_diverged_cell(r) for r in seeds if r.status != "ok") + ")"
                ),
                agg("val_loss", 4),
                agg("train_loss", 4),
                agg("magnitude"),
                agg("median_magnitude"),
                agg("magnitude_per_coordinate"),
                agg("variance"),
                agg("magnitude_top2_removed"),
                agg("magnitude_growth"),
                agg("magnitude_growth_slope"),
                agg("variance_growth"),
                spikes,
                layers,
                agg("last_attn_entropy"),
                agg("saturation") if any(math.isfinite(METRICS["saturation"](r)) for r in ok) else "-",
            ]
        )
    return _table(GROUP_COLUMNS, rows)


MATCHED_COLUMNS = (
    "scheme",
    "lr",
    "seeds ok",
    "val loss",
    "last-layer magnitude (mean token)",
    "median token",
    "per coordinate (/sqrt d)",
    "last-layer variance",
    "ln magnitude growth L/4..L",
    "ln variance growth L/4..L",
)


def matched_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Every group's kept candidate at every matched rate (evaluation seeds): the numbers the depth claims use."""
    rows = []
    for lr in design.matched_lrs:
        for g in design.groups:
            if design.kept(g.label) is None:
                continue
            at = design.evaluation_runs(runs, g.label, lr)
            ok = [r for r in at if r.status == "ok"]

            def agg(metric: str, digits: int = 3, at: list[RunResult] = at) -> str:
                return _ci(stats.interval(per_seed(at, metric).values()), digits)

            rows.append(
                [g.label, f"{lr:g}", f"{len(ok)}/{len(at)}", agg("val_loss", 4), agg("magnitude")]
                + [agg("median_magnitude"), agg("magnitude_per_coordinate"), agg("variance")]
                + [agg("magnitude_growth"), agg("variance_growth")]
            )
    return _table(MATCHED_COLUMNS, rows) if rows else "(no matched rate: see the design section)"


def design_table(design: StudyDesign) -> str:
    """Each group's selection: its budget (candidates x rates + extensions), the kept candidate and rate, the
    rates added past the grid, and the edge flag."""
    rows = []
    for g in design.groups:
        s = design.selections.get(g.label)
        if s is None:
            rows.append([g.label, str(len(g.candidates)), "-", "-", "-", "-", "selection unfinished"])
            continue
        failed = "none trained: " + "; ".join(f"{r.spec.label} {_diverged_cell(r)}" for r in s.runs)
        rows.append(
            [
                g.label,
                str(len(g.candidates)),
                str(s.budget),
                s.candidate or failed,
                f"{s.lr:g}" if s.chosen is not None else "-",
                ", ".join(f"{lr:g}" for lr in s.extensions) or "-",
                f"**at the {s.edge} rate tried**" if s.edge else "inside",
            ]
        )
    header = ["scheme", "candidates", "selection runs", "kept candidate", "best lr", "grid extensions", "edge"]
    return _table(header, rows)


def budget_note(design: StudyDesign) -> str:
    """Whether every group had the same selection budget, and why not where it did not."""
    budgets = {g.label: design.selections[g.label].budget for g in design.groups if g.label in design.selections}
    if not budgets:
        return ""
    if len(set(budgets.values())) == 1:
        return f"Every group had the same selection budget: {next(iter(budgets.values()))} runs."
    parts = []
    for g in design.groups:
        if g.label not in budgets:
            continue
        s = design.selections[g.label]
        why = []
        if len(g.candidates) > 1:
            why.append(f"{len(g.candidates)} grid candidates")
        if s.extensions:
            why.append(f"{len(s.extensions)} extension(s) past the grid")
        if why:
            parts.append(f"{g.label}: {budgets[g.label]} runs ({', '.join(why)})")
    low = min(budgets.values())
    return (
        f"Selection budgets differ: {low} runs (one candidate at every --lrs rate) for most groups; "
        + "; ".join(parts)
        + ". A grid group searches its grid option as well as the rate (an option the scheme leaves to tuning); "
        "an extension spends runs where the grid's edge held the best rate."
    )


def lr_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Validation loss of every selection run (selection seed): candidates (rows) x learning rates (grid and
    extensions); the kept cell in bold; diverged runs give the step of divergence."""
    lrs = sorted({r.spec.lr for r in runs if r.spec.seed_index == SELECTION_SEED})
    rows = []
    for g in design.groups:
        s = design.selections.get(g.label)
        for v in g.candidates:
            cells = []
            for lr in lrs:
                r = runs.get(RunKey(g.label, v.label, rate_key(lr), SELECTION_SEED))
                if r is None:
                    cells.append("-")
                elif r.status == "diverged":
                    cells.append(f"diverged @{r.diverged_step}")
                elif r.status == "error":
                    cells.append("error")
                else:
                    text = _num(r.val_loss, 4)
                    kept = s is not None and s.chosen is not None and s.chosen.spec.label == r.spec.label
                    cells.append(f"**{text}**" if kept else text)
            rows.append([_flag(design, g.label), v.label] + cells)
    return _table(["scheme", "candidate"] + [f"lr {lr:g}" for lr in lrs], rows)


def budget_lines(runs: StudyRuns, design: StudyDesign, meta: dict[str, Any]) -> list[str]:
    """How far training got: the schemes' mean validation loss against the unigram loss of the same tokens."""
    unigram = meta.get("unigram_loss")
    means = {
        g.label: _mean(list(per_seed(best_runs(runs, design, g.label), "val_loss").values())) for g in design.groups
    }
    means = {k: v for k, v in means.items() if math.isfinite(v)}
    if unigram is None or not means:
        return []
    gap = {k: v - unigram for k, v in means.items()}
    lo, hi = min(gap, key=gap.get), max(gap, key=gap.get)
    return [
        f"Training budget: {meta.get('tokens_per_run', '?')} training tokens per run. The unigram loss of the "
        f"validation tokens (token frequencies of 32 training batches) is {unigram:.3f} nats; mean validation "
        f"loss minus it: {gap[lo]:+.3f} ({lo}) to {gap[hi]:+.3f} ({hi}) nats (negative: below the unigram level)."
    ]


def divergence_edge(results: Sequence[RunResult]) -> str:
    """Where the learning-rate grid diverged: the lowest diverging learning rate per candidate, or none."""
    first = [r for r in results if r.spec.seed_index == SELECTION_SEED]
    diverged = sorted({(r.spec.candidate, r.spec.lr) for r in first if r.status == "diverged"})
    if not diverged:
        top = max((r.spec.lr for r in first), default=math.nan)
        return f"Divergence edge: no selection run diverged, so the edge lies above the largest LR tried ({top:g})."
    edge: dict[str, float] = {}
    for label, lr in diverged:
        edge[label] = min(lr, edge.get(label, math.inf))
    listed = ", ".join(f"{label} from lr {lr:g}" for label, lr in edge.items())
    return f"Divergence edge (lowest diverging learning rate tried): {listed}; the others trained at every LR."


def importance_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Layer importance: validation-loss increase when one block is skipped, mean over seeds, summarised by
    depth quarter, with the number of blocks whose removal costs less than 0.01 nats."""
    rows = []
    for g in design.groups:
        seeds = [r for r in best_runs(runs, design, g.label) if r.status == "ok" and r.importance]
        if not seeds:
            continue
        n = min(len(r.importance) for r in seeds)
        mean = [_mean([r.importance[i] for r in seeds]) for i in range(n)]
        q = max(1, n // 4)
        quarters = [mean[i * q : (i + 1) * q] if i < 3 else mean[3 * q :] for i in range(4)]
        rows.append(
            [_flag(design, g.label), str(len(seeds))]
            + [_num(_mean(part)) for part in quarters]
            + [str(int(max(range(n), key=lambda i: mean[i])) + 1), f"{sum(v < 0.01 for v in mean)}/{n}"]
        )
    header = [
        "scheme",
        "seeds",
        "mean dloss, first quarter",
        "second",
        "third",
        "last quarter",
        "most important layer",
        "blocks < 0.01 nats",
    ]
    return _table(header, rows) if rows else "(layer importance not measured)"


def approximation_table(runs: StudyRuns, design: StudyDesign, reference: str | None) -> str:
    """Where an approximated site-B statistic parts from the exact one: for every group whose runs record
    ``bhyt_moment_ratio`` (approximated over exact second moment, 1 = exact) or that is the ``reference`` group
    (the role ``BHyT*``), the ratio in the first 4 layers and the rest, over positions 0-7 and later (at the
    group's best rate), and the last-layer magnitude and variance as a ratio to the reference's (seed-paired, exp
    of the mean ln ratio) at each matched rate: depth statistics move with the learning rate, so, as in the
    depth claims, both sides are read at the same rate."""

    def has_ratio(runs: Sequence[RunResult]) -> bool:
        return any(k.startswith("bhyt_moment_ratio/") for r in runs for k in r.depth_final)

    family = [g for g in design.groups if g.label == reference or has_ratio(best_runs(runs, design, g.label))]
    if not family:
        return "(no group with an approximated statistic)"
    lrs = design.matched_lrs if reference else ()
    rows = []
    for g in family:
        ok = [r for r in best_runs(runs, design, g.label) if r.status == "ok"]
        if not ok:
            continue

        def ratio(stat: str, lo: int, hi: int | None, ok: list[RunResult] = ok) -> str:
            """Mean over the layers ``lo <= i < hi`` (0-based) that have the statistic, then over seeds."""
            per_run = []
            for r in ok:
                layers = {
                    split[1]: v
                    for k, v in r.depth_final.items()
                    if (split := split_layer_key(k)) is not None and split[0] == stat
                }
                per_run.append(_mean([v for i, v in layers.items() if i >= lo and (hi is None or i < hi)]))
            return _num(_mean(per_run))

        cells = [_flag(design, g.label), ratio("bhyt_moment_ratio", 0, 4), ratio("bhyt_moment_ratio", 4, None)]
        cells += [ratio("bhyt_moment_ratio_first8", 0, None), ratio("bhyt_moment_ratio_rest", 0, None)]
        for stat in ("magnitude", "variance"):
            ratios = (
                []
                if g.label == reference
                else [_matched_ratio(runs, design, g.label, reference, lr, stat) for lr in lrs]
            )
            cells.append("; ".join(r for r in ratios if r) or "-")
        rows.append(cells)
    header = ["scheme", "moment ratio, layers 1-4", "layers 5-L", "positions 0-7", "positions 8+"]
    header += [f"last-layer {stat} / {reference}'s, rate: ratio [95% CI]" for stat in ("magnitude", "variance")]
    return _table(header, rows)


def _matched_ratio(runs: StudyRuns, design: StudyDesign, group: str, reference: str, lr: float, stat: str) -> str:
    """``lr: exp(mean) [exp(low), exp(high)]`` of the seed-paired ln ratio group / reference at one matched rate."""
    sides = [
        {r.spec.seed_index: ln_value(r, stat) for r in design.evaluation_runs(runs, label, lr) if r.status == "ok"}
        for label in (group, reference)
    ]
    if not sides[0] or not sides[1]:
        return ""
    d = stats.interval(stats.paired_differences(*sides))
    return f"{lr:g}: {_num(math.exp(d.mean))} [{_num(math.exp(d.low))}, {_num(math.exp(d.high))}]"


# ----------------------------------------------------------------------------- depth-wise growth
GROWTH_MARGIN = MARGINS["magnitude_growth"]
"""A profile whose ln growth from layer L/4 to L lies within +-this (90 % interval, TOST) reads "flat"."""


def growth_words(iv: stats.Interval, margin: float = GROWTH_MARGIN) -> str:
    """Words that follow the numbers: "grows" (95 % interval above 0), "shrinks" (below 0), "flat" (90 %
    interval within +-margin), else "unresolved"."""
    if not iv.defined:
        return "unresolved (fewer than 2 seeds)"
    p_flat, _ = stats.rule_p_values(iv, "equivalent", margin)
    if p_flat < stats.ALPHA:
        return f"flat (within +-{margin:g} in ln)"
    if iv.low > 0:
        return "grows with depth"
    if iv.high < 0:
        return "shrinks with depth"
    return "unresolved"


def growth_rows(runs: StudyRuns, design: StudyDesign) -> list[tuple[str, str, dict]]:
    """``(group, rate, {metric: interval})`` for every group at its best rate and at each matched rate."""
    out = []
    for g in design.groups:
        s = design.kept(g.label)
        if s is None:
            continue
        rates: dict[str, float] = {}  # by rate key: the best rate once when it is a matched one
        for lr in (*design.matched_lrs, s.lr):
            rates.setdefault(rate_key(lr), lr)
        for key, lr in rates.items():
            at = design.evaluation_runs(runs, g.label, lr)
            ivs = {m: stats.interval(per_seed(at, m).values()) for m in GROWTH_METRICS}
            best = key == rate_key(s.lr)
            out.append((_flag(design, g.label) if best else g.label, f"{lr:g}" + (" (best)" if best else ""), ivs))
    return out


GROWTH_METRICS = ("magnitude_growth", "magnitude_growth_slope", "variance_growth", "variance_growth_slope")


def growth_table(rows: list[tuple[str, str, dict]]) -> str:
    header = ["scheme", "lr", "ln(magnitude L / L/4)", "magnitude ratio", "slope/layer", "ln(variance L / L/4)"]
    header += ["variance slope/layer", "magnitude reads"]
    body = []
    for group, lr, ivs in rows:
        m = ivs["magnitude_growth"]
        body.append(
            [group, lr, _ci(m), _num(math.exp(m.mean)) if math.isfinite(m.mean) else "n/a"]
            + [_ci(ivs["magnitude_growth_slope"]), _ci(ivs["variance_growth"]), _ci(ivs["variance_growth_slope"])]
            + [growth_words(m)]
        )
    return _table(header, body) if body else "(no evaluation run yet)"


def growth_prose(rows: list[tuple[str, str, dict]]) -> list[str]:
    """One sentence per scheme from the growth table: what its magnitude does from layer L/4 to L, per rate."""
    by_group: dict[str, list[str]] = {}
    for group, lr, ivs in rows:
        m = ivs["magnitude_growth"]
        if not math.isfinite(m.mean):
            continue
        by_group.setdefault(group.split(" (edge: ", 1)[0], []).append(
            f"at lr {lr} the last layer's magnitude is {_num(math.exp(m.mean))}x layer L/4's "
            f"(ln {_num(m.mean)}): {growth_words(m)}"
        )
    return [f"- {group}: " + "; ".join(parts) + "." for group, parts in by_group.items()]


# ----------------------------------------------------------------------------- claims
def _short_ci(iv: stats.Interval) -> str:
    if not iv.defined:
        return f"{_num(iv.mean)} (n={iv.n})" if iv.n else "n/a"
    return f"{_num(iv.mean)} [{_num(iv.low)}, {_num(iv.high)}]"


def _claim_name(c: ClaimResult) -> str:
    return f"{c.spec.statement} [{c.spec.source}]: {c.target} vs {c.baseline}"


def _edge_note(c: ClaimResult, design: StudyDesign) -> str:
    """Best-arm claims of a group whose best rate is still at an edge carry the flag."""
    if c.spec.arm != "best":
        return ""
    flagged = [g for g in (c.target, c.baseline) if design.selections.get(g) and design.selections[g].edge]
    return " (edge: " + ", ".join(flagged) + ")" if flagged else ""


def summary_table(items: Sequence[ClaimResult], design: StudyDesign) -> str:
    """claim | arm | rate(s) | difference [95 % CI] | verdict | Holm-adjusted verdict: one row per claim, each
    matched rate's difference in the rate order."""
    rows = []
    for c in items:
        if c.spec.arm == "best":
            t = c.tests[0]
            rates = f"{t.lrs[0]:g} / {t.lrs[1]:g}"
        else:
            rates = "; ".join(t.rate for t in c.tests) or "none"
        diffs = "; ".join(_short_ci(t.difference) for t in c.tests) or "n/a"
        rows.append(
            [
                _claim_name(c) + _edge_note(c, design),
                c.spec.arm,
                rates,
                diffs,
                f"**{c.verdict}**",
                c.holm_verdict,
            ]
        )
    header = ["claim", "arm", "rate(s)", "difference [95 % CI]", "verdict", "Holm-adjusted verdict"]
    return _table(header, rows) if rows else "(no claim testable with these schemes)"


def _rule_text(c: ClaimResult) -> str:
    m = c.spec.margin_value
    if c.spec.rule == "no_worse":
        return f"upper 95% bound < +{m:g}"
    if c.spec.rule == "equivalent":
        return f"TOST: 90% CI within +-{m:g}"
    return "95% CI < 0" if c.spec.rule == "lower" else "95% CI > 0"


def detail_table(items: Sequence[ClaimResult]) -> str:
    """Every (claim, rate) test: metric, rule with its margin, pairs, 95 % and 90 % intervals, p-values (raw and
    Holm-adjusted) and the seeds a decisive interval would take at the measured mean and spread."""
    rows = []
    for c in items:
        for t in c.tests:
            room = math.nan
            if t.verdict == stats.INCONCLUSIVE and t.difference.defined:
                m = c.spec.margin_value or 0.0
                room = {
                    "lower": -t.difference.mean,
                    "higher": t.difference.mean,
                    "no_worse": m - t.difference.mean,
                    "equivalent": m - abs(t.difference.mean),
                }[c.spec.rule]
            # a TOST is decided by its 90 % interval (t_0.95), every other rule by the 95 % one (t_0.975)
            confidence = 0.90 if c.spec.rule == "equivalent" else 0.95
            needed = stats.seeds_needed(t.difference, room, confidence=confidence) if math.isfinite(room) else None
            rows.append(
                [
                    _claim_name(c),
                    f"{c.spec.metric}{' (ln ratio)' if c.spec.metric in LOG_METRICS else ''}",
                    t.rate,
                    _rule_text(c) + (f"; {c.condition}" if c.condition else ""),
                    str(t.difference.n),
                    _ci(t.difference),
                    _short_ci(t.difference_90),
                    f"{_num(t.p_for)} / {_num(t.p_against)}",
                    f"{_num(t.holm_p_for)} / {_num(t.holm_p_against)}",
                    t.verdict,
                    str(needed) if needed else "-",
                ]
            )
    header = ["claim", "metric", "rate", "rule", "pairs", "mean [95% CI] (min-max)", "90% CI"]
    header += ["p for / against", "Holm p for / against", "verdict at this rate", "seeds for a decisive CI"]
    return _table(header, rows) if rows else "(no claim)"


_LETTER = {stats.REPRODUCED: "R", stats.NOT_REPRODUCED: "N", stats.INCONCLUSIVE: "."}


def training_table(items: Sequence[ClaimResult]) -> str:
    """Every (claim, rate) test at each trajectory point, as one letter per point (R reproduced, N not
    reproduced, . inconclusive), with the difference at the first and last points."""
    rows = []
    for c in items:
        for t in c.tests:
            points = t.over_training
            if not points:
                continue
            letters = "".join(_LETTER.get(p["verdict"], "?") for p in points)

            def cell(p: dict[str, Any]) -> str:
                return f"{_num(p['mean'])} [{_num(p['low'])}, {_num(p['high'])}] @{p['tokens']:,}"

            rows.append(
                [
                    _claim_name(c),
                    t.rate,
                    f"`{letters}`",
                    cell(points[1] if len(points) > 1 else points[0]),
                    cell(points[-1]),
                ]
            )
    header = ["claim", "rate", "verdict at each point (step 0 first)", "first trained point", "last point"]
    return _table(header, rows) if rows else "(no trajectory)"


def claims_figure(items: Sequence[ClaimResult]) -> Any:
    """Each claim's difference (mean with its 95 % interval) against training tokens, one panel per claim and
    one line per rate; the dashed line is 0, dotted lines the margin."""
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
        ax.set_xscale(
            "symlog",
            linthresh=max(
                1, min((p["tokens"] for t in c.tests for p in t.over_training if p["tokens"] > 0), default=1)
            ),
        )
        ax.set_title(f"{c.target} - {c.baseline}: {c.spec.metric}", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=5)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    figure.supxlabel("training tokens")
    figure.suptitle("claims over training: target - baseline, mean and 95% CI over evaluation seeds", fontsize=10)
    return figure


def verdict_counts(items: Sequence[ClaimResult]) -> list[str]:
    """How many claims received each verdict, per-claim and Holm-adjusted."""
    lines = []
    for name, get in (("per claim", lambda c: c.verdict), ("Holm-adjusted", lambda c: c.holm_verdict)):
        counts: dict[str, int] = {}
        for c in items:
            counts[get(c)] = counts.get(get(c), 0) + 1
        listed = ", ".join(f"{v}: {n}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        lines.append(f"- {name} ({len(items)} claims): {listed}")
    return lines


# ----------------------------------------------------------------------------- figures
def _color(groups: Sequence[SchemeGroup], label: str) -> Any:
    """One colour per scheme group, the same in every panel and figure."""
    from matplotlib import colormaps

    labels = [g.label for g in groups]
    palette = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return palette(labels.index(label) % palette.N)


def _band(ax: Any, x: Sequence[float], series: list[list[float]], label: str, color: Any = None) -> None:
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


def depth_profile_figure(runs: StudyRuns, design: StudyDesign, title: str) -> Any:
    """Paper Figure 3 and its robust variants against depth at the end: mean over seeds with a min-max band, every
    group at the same (matched) rate when there is one."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    stats_ = ("magnitude", "variance", "median_magnitude", "magnitude_top2_removed")
    figure = Figure(figsize=(13, 8), layout="constrained")
    axes = figure.subplots(2, 2).ravel()
    for ax, stat in zip(axes, stats_, strict=True):
        for g in design.groups:
            seeds = [r for r in depth_runs(runs, design, g.label) if r.status == "ok"]
            series = [layer_series(r.depth_final, stat) for r in seeds]
            series = [s for s in series if s]
            if series:
                _band(ax, range(1, len(series[0]) + 1), series, g.label, _color(design.groups, g.label))
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer (block output)")
        ax.set_title(stat.replace("_", " "))
        ax.grid(alpha=0.3, which="both")
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(f"{title}; {depth_runs_words(design)}")
    return figure


def trajectory_figure(runs: StudyRuns, design: StudyDesign, title: str) -> Any:
    """Last-layer magnitude, median-token magnitude, log-magnitude slope and tanh saturation against the
    optimizer step: mean over seeds with a min-max band, every group at the same (matched) rate when there is one."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 8), layout="constrained")
    axes = figure.subplots(2, 2).ravel()
    panels = (
        ("last-layer magnitude", lambda p: _last(p["magnitude"]), True),
        ("last-layer median-token magnitude (position 0 excluded)", lambda p: _last(p["median_magnitude"]), True),
        ("slope of ln magnitude vs layer (2..L)", lambda p: p["magnitude_slope"], False),
        ("tanh saturation (mean over sites and layers)", lambda p: _mean(p["saturation"]), False),
    )
    for ax, (name, fn, log_scale) in zip(axes, panels, strict=True):
        for g in design.groups:
            seeds = [r for r in depth_runs(runs, design, g.label) if r.status == "ok" and r.trajectory]
            if not seeds:
                continue
            steps = [p["step"] for p in seeds[0].trajectory]
            series = [[fn(p) for p in r.trajectory] for r in seeds]
            _band(ax, steps, series, g.label, _color(design.groups, g.label))
        if log_scale:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(f"{title}; {depth_runs_words(design)}")
    return figure


def lr_figure(runs: StudyRuns, design: StudyDesign, max_loss: float) -> Any:
    """Validation loss against learning rate on the first seed, one line per candidate; a diverged run is an
    'x' at the top of the plot (the divergence edge)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    first = [r for r in runs if r.spec.seed_index == SELECTION_SEED]
    finite = [r.val_loss for r in first if r.status == "ok" and math.isfinite(r.val_loss)]
    top = max(finite) + 0.1 if finite else max_loss
    for g in design.groups:
        for v in g.candidates:
            tried = sorted(
                (r for r in first if r.spec.group == g.label and r.spec.candidate == v.label),
                key=lambda r: r.spec.lr,
            )
            if not tried:
                continue
            ok = [r for r in tried if r.status == "ok"]
            (line,) = ax.plot(
                [r.spec.lr for r in ok], [r.val_loss for r in ok], marker="o", markersize=3, label=v.label
            )
            bad = [r.spec.lr for r in tried if r.status != "ok"]
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


def importance_figure(runs: StudyRuns, design: StudyDesign) -> Any:
    """Validation-loss increase when each block alone is replaced by the identity, mean with a seed band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(9, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in design.groups:
        seeds = [r for r in best_runs(runs, design, g.label) if r.status == "ok" and r.importance]
        if seeds:
            _band(
                ax,
                range(1, len(seeds[0].importance) + 1),
                [r.importance for r in seeds],
                g.label,
                _color(design.groups, g.label),
            )
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block replaced by the identity")
    ax.set_ylabel("validation loss increase (nats)")
    ax.set_title("layer importance")
    ax.grid(alpha=0.3, which="both")
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


def loss_figure(runs: StudyRuns, design: StudyDesign, title: str) -> Any:
    """Training loss against step over the seeds of each group (mean with a min-max band)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in design.groups:
        seeds = [r for r in best_runs(runs, design, g.label) if r.status == "ok" and r.losses]
        if seeds:
            _band(
                ax,
                [s for s, _ in seeds[0].losses],
                [[v for _, v in r.losses] for r in seeds],
                g.label,
                _color(design.groups, g.label),
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


# ----------------------------------------------------------------------------- the report
def margins_lines(items: Sequence[ClaimResult]) -> list[str]:
    margins = sorted({(c.spec.metric, c.spec.margin_value) for c in items if c.spec.margin_value is not None})
    if not margins:
        return []
    listed = ", ".join(f"{metric} +-{m:g}" for metric, m in margins)
    return [f"Margins (docs/method.md, section 10): {listed}."]


def write_report(out: Path, record: StudyRecord, figures: bool = True, save: bool = True) -> dict[str, Path]:
    """``results.json`` (``record`` with every claim's tests and run labels; not when ``save`` is False),
    ``report.md`` and (``figures``) the PNGs under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    meta, design, sweep = record.meta, record.design, record.sweep
    runs = StudyRuns(record.runs) if design is not None else None
    paths = {"results": out / "results.json", "report": out / "report.md"}
    items: list[ClaimResult] = []
    skipped: list[ClaimSpec] = []
    roles = meta.get("roles", {})
    if design is not None:
        items, skipped = evaluate(runs, design, roles, tokens_per_step=int(meta.get("tokens_per_step", 0)))
    if save:
        document = record.to_dict(
            [c.to_dict() for c in items], [f"{c.statement}: {c.target} vs {c.baseline}" for c in skipped]
        )
        paths["results"].write_text(json.dumps(document, indent=1, default=str))
    max_loss = float(meta["max_loss"])
    title = (
        f"{meta['preset']} ({meta['n_layers_label']} layers), {meta['steps']} steps of {meta['tokens_per_step']} tokens"
    )
    lines = [f"# {'Stability sweep' if sweep else 'Depth study'}", "", f"Command: `{meta['command']}`", ""]
    skip = ("command", "machine", "n_layers_label", "overrides", "roles")
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in meta.items() if k not in skip]
    lines.append(f"- layers: {meta['n_layers_label']}; config overrides: {meta.get('overrides') or 'none'}")
    lines.append("- machine: " + ", ".join(f"{k} {v}" for k, v in meta["machine"].items()))
    lines.append("")
    if sweep:
        if figures:
            paths["grid"] = save_figure(sweep_figure(record.runs, max_loss), out / "sweep_grid.png")
        lines += [
            f"Final training loss (mean of the last 10% of steps); **diverged**: loss NaN/inf or > {max_loss:.3g} "
            "at that step.",
            "",
            sweep_table(record.runs),
            "",
            "![stability grid](sweep_grid.png)",
        ]
        paths["report"].write_text("\n".join(lines) + "\n")
        return paths
    if figures:
        paths["depth_final"] = save_figure(
            depth_profile_figure(runs, design, f"end of training: {title}"), out / "depth_final.png"
        )
        paths["trajectories"] = save_figure(trajectory_figure(runs, design, title), out / "trajectories.png")
        paths["lr"] = save_figure(lr_figure(runs, design, max_loss), out / "lr_sensitivity.png")
        paths["importance"] = save_figure(importance_figure(runs, design), out / "layer_importance.png")
        paths["loss"] = save_figure(loss_figure(runs, design, title), out / "loss.png")
        paths["claims"] = save_figure(claims_figure(items), out / "claims_over_training.png")
    role_text = ", ".join(f"{role} = {group}" for role, group in roles.items()) or "none"
    growth = growth_rows(runs, design)
    lines += [
        "## Design",
        "",
        "Selection and evaluation use different seeds: the selection seed (index 0) picks each group's candidate "
        "and learning rate by validation loss; every reported number comes from the evaluation seeds (indices "
        "1..N). A best rate at an end of the rates its candidate tried is extended one grid step on that side "
        f"(up to {meta.get('extensions', '?')} time(s)); a group still there is flagged *edge* in every table "
        "that uses it.",
        "",
        design_table(design),
        "",
        budget_note(design),
        "",
        f"Matched rates: {', '.join(f'{lr:g}' for lr in design.matched_lrs) or 'none'} "
        f"({design.matched_note or 'not set yet'}).",
        f"Roles of the claims: {role_text}.",
        "",
        "## Claims",
        "",
        "Each claim compares two groups through the seed-paired difference target - baseline over the evaluation "
        "seeds (magnitudes and variances as ln ratios). Arm *best*: each group at its best rate (rates shown "
        "target / baseline); arm *matched*: both at the same rate, at every matched rate, and the verdict holds "
        "only when it holds at every rate, else it reads *depends on the learning rate*. Rules: *lower*: 95% CI "
        "< 0; *no worse*: upper 95% bound < +margin; *~*: TOST, 90% CI within +-margin; *not reproduced*: the "
        "95% interval on the other side (of 0, or wholly outside the margin). Holm-adjusted: the same rules on "
        "Holm step-down p-values over every (claim, rate) test of the family (family-wise error 5%).",
        *margins_lines(items),
        "",
        summary_table(items, design),
        "",
        *verdict_counts(items),
        "",
    ]
    if skipped:  # the sweep returned above
        missing = sorted({role for c in skipped for role in (c.target, c.baseline) if role not in roles})
        lines += [f"Not tested: {len(skipped)} claims of the table (roles without a group: {', '.join(missing)}).", ""]
    lines += [
        "### Every test",
        "",
        detail_table(items),
        "",
        "## Claims over training",
        "",
        "Every test again at each trajectory point (validation loss and depth statistics on the same fixed "
        "batches): one letter per point, R reproduced, N not reproduced, . inconclusive (step 0 is the "
        "initialisation).",
        "",
        training_table(items),
        "",
        "![claims over training](claims_over_training.png)",
        "",
        "## Depth-wise growth",
        "",
        "Per run: ln(value at layer L / value at layer L/4) and the least-squares slope of ln value per layer over "
        "layers L/4..L, mean [95% CI] (min-max) over the evaluation seeds. Reads: *grows* / *shrinks* when the 95% "
        f"interval of the ln magnitude ratio excludes 0, *flat* when its 90% interval lies within +-{GROWTH_MARGIN:g}.",
        "",
        growth_table(growth),
        "",
        *growth_prose(growth),
        "",
        "## Schemes at matched rates",
        "",
        "Last layer: the last block's output on the fixed validation batches in eval mode at the end; mean-token "
        "magnitude: mean over tokens of ||y_t||; median token: median over tokens (position 0 excluded); per "
        "coordinate: the mean-token magnitude / sqrt(d), the scale to set beside a wider model's numbers.",
        "",
        matched_table(runs, design),
        "",
        "## Schemes at their best learning rate",
        "",
        "mean [95% t-interval] (min-max) over evaluation seeds; diverged runs are left out of the means. "
        "w/o top-2 channels: the two channels with the largest mean |y| dropped. Spikes, layer of max grad norm "
        "(1-based, per seed) and attention entropy (nats) from StabilityMonitor on the training batch at its "
        "last logging step.",
        "",
        group_table(runs, design),
        "",
        *budget_lines(runs, design, meta),
        "",
        "## Learning-rate sensitivity (selection seed, validation loss; bold: kept)",
        "",
        lr_table(runs, design),
        "",
        divergence_edge(runs.results),
        "",
        "![LR sensitivity](lr_sensitivity.png)",
        "",
        "## Layer importance (loss increase on the first validation batch when one block is replaced by the identity)",
        "",
        importance_table(runs, design),
        "",
        "![layer importance](layer_importance.png)",
        "",
        "## Approximated against exact statistics (site B)",
        "",
        "Moment ratio: site B's approximated second moment over the exact one (1 = exact; below 1 the "
        "approximation under-predicts and site B's tanh argument grows), mean over layers, positions and seeds at "
        "the group's best rate; n/a where site B is exact. Last-layer ratios to the exact-statistics group: "
        "seed-paired, at each matched rate.",
        "",
        approximation_table(runs, design, roles.get("BHyT*")),
        "",
        "## Theorem condition lambda/kappa < 1/sqrt(L) (evaluation runs that record it)",
        "",
        bound_table([r for r in runs if r.spec.seed_index != SELECTION_SEED]),
        "",
        "## Figures",
        "",
        f"Depth profile and trajectories: {depth_runs_words(design)}; training loss: each scheme at its best lr.",
        "",
        "![depth profile at the end](depth_final.png)",
        "",
        "![trajectories](trajectories.png)",
        "",
        "![training loss](loss.png)",
    ]
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths

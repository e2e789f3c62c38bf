"""The study's report: markdown tables and matplotlib figures from a list of ``RunResult``.

Seed aggregation and verdicts come from ``bhyt_pl.study.stats``; the claims are the paper's that can be
tested at this scale (docs/method.md). Figures are plain ``matplotlib.figure.Figure`` objects saved with
the Agg canvas (no pyplot state); seed bands span the min-max over seeds around the mean.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bhyt_pl.callbacks.layer_metrics import layer_series, split_layer_key
from bhyt_pl.study import stats
from bhyt_pl.study.runner import RunResult, log_slope

__all__ = [
    "GROUP_COLUMNS",
    "ROLES",
    "Claim",
    "bound_table",
    "claims",
    "claims_table",
    "group_runs",
    "group_table",
    "lr_table",
    "per_seed",
    "save_figure",
    "sweep_figure",
    "sweep_table",
    "write_report",
]

GROUP_COLUMNS = (
    "scheme",
    "chosen",
    "lr",
    "seeds ok",
    "val loss",
    "train loss",
    "last-layer magnitude",
    "last-layer variance",
    "median-token magnitude",
    "magnitude w/o top-2 channels",
    "log-magnitude slope (layers 2-L)",
    "loss / grad-norm spikes",
    "layer of max grad norm",
    "last-layer attn entropy",
    "tanh saturation",
)
"""Columns of the per-scheme table (``group_table``): mean [95% CI] (min-max) over seeds where numeric."""

ROLES: dict[str, str] = {
    "BHyT": "bhyt",
    "BHyT*": "bhyt_exact",
    "RMSNorm": "rmsnorm",
    "LayerNorm": "layernorm",
    "LNS": "lns",
    "Peri-LN": "peri_ln",
    "DyT": "dyt",
}
"""The roles of the paper's claims and the registered scheme that plays each: the one place the report
names schemes; a study group plays the role of its ``norm``."""

BHYT_FAMILY = ("BHyT", "BHyT*")
"""Roles whose groups get the approximation table and the variance-theorem claim."""

_ROLE_OF_NORM = {norm: role for role, norm in ROLES.items()}


def _role(group: Any) -> str | None:
    """The role a study group plays in the claims (``ROLES``), None for other schemes."""
    return _ROLE_OF_NORM.get(group.norm)


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
    return r.spec.label.split("@", 1)[0]


def sweep_figure(results: Sequence[RunResult], max_loss: float) -> Any:
    """The stability grid: one panel per scheme, depth (rows) x learning rate (columns), coloured by the
    final training loss; diverged cells are black with the step of divergence. First seed only."""
    import numpy as np
    from matplotlib.figure import Figure

    results = [r for r in results if seed_index(r) == 0]
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


# ----------------------------------------------------------------------------- seeds and groups
def seed_index(r: RunResult) -> int:
    """The seed index of a run (its label ends in ``-s<i>``)."""
    return int(r.spec.label.rsplit("-s", 1)[1])


def group_runs(results: Sequence[RunResult], group: str, chosen: str | None) -> list[RunResult]:
    """The runs every statistic of ``group`` is reported on: the chosen first-seed run and the other seeds."""
    if chosen is None:
        return []
    return sorted(
        (r for r in results if r.spec.group == group and (r.spec.label == chosen or seed_index(r) > 0)),
        key=seed_index,
    )


def _final_point(r: RunResult) -> dict[str, Any]:
    return r.trajectory[-1] if r.trajectory else {}


def _last(values: Sequence[float]) -> float:
    return values[-1] if values else math.nan


METRICS: dict[str, Callable[[RunResult], float]] = {
    "val_loss": lambda r: r.val_loss,
    "train_loss": lambda r: r.train_loss,
    "magnitude": lambda r: r.last_layer("magnitude"),
    "variance": lambda r: r.last_layer("variance"),
    "median_magnitude": lambda r: r.last_layer("median_magnitude"),
    "magnitude_top2_removed": lambda r: r.last_layer("magnitude_top2_removed"),
    "magnitude_slope": lambda r: log_slope(layer_series(r.depth_final, "magnitude")),
    "saturation": lambda r: _mean([v for v in _final_point(r).get("saturation", [])]),
    "loss_spikes": lambda r: float(r.stability.get("loss_spikes", math.nan)) if r.stability else math.nan,
    "grad_norm_spikes": lambda r: float(r.stability.get("grad_norm_spikes", math.nan)) if r.stability else math.nan,
    "max_grad_layer": lambda r: _stability_last(r, "max_grad_layer"),
    "last_attn_entropy": lambda r: _stability_last(r, "last_attn_entropy"),
}
"""Per-run scalars the tables aggregate over seeds (last layer = the last block's output, end of training)."""

LOG_METRICS = {"magnitude", "variance", "median_magnitude", "magnitude_top2_removed"}
"""Compared between schemes as ``ln(a) - ln(b)`` (ratios: they span orders of magnitude across schemes)."""


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _stability_last(r: RunResult, key: str) -> float:
    steps = r.stability.get("steps", []) if r.stability else []
    value = steps[-1].get(key) if steps else None
    return float(value) if value is not None else math.nan


def per_seed(runs: Sequence[RunResult], metric: str) -> dict[int, float]:
    """``{seed index: value}``; NaN for runs that diverged or failed (no pair in comparisons)."""
    return {seed_index(r): (METRICS[metric](r) if r.status == "ok" else math.nan) for r in runs}


def _ci(iv: stats.Interval, digits: int = 3) -> str:
    if iv.n == 0:
        return "n/a"
    if not iv.defined:
        return f"{_num(iv.mean, digits)} (n={iv.n})"
    spread = f"({_num(iv.minimum, digits)}-{_num(iv.maximum, digits)})"
    return f"{_num(iv.mean, digits)} [{_num(iv.low, digits)}, {_num(iv.high, digits)}] {spread}"


def group_table(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> str:
    """One row per scheme group (``GROUP_COLUMNS``) over its seeds at the chosen candidate and learning rate."""
    rows = []
    for g in groups:
        runs = group_runs(results, g.label, chosen.get(g.label))
        if not runs:
            rows.append([g.label, "selection unfinished"] + ["-"] * (len(GROUP_COLUMNS) - 2))
            continue
        ok = [r for r in runs if r.status == "ok"]

        def agg(metric: str, digits: int = 3) -> str:
            return _ci(stats.interval(per_seed(runs, metric).values()), digits)

        loss_spikes = _mean([METRICS["loss_spikes"](r) for r in ok])
        spikes = f"{_num(loss_spikes)} / {_num(_mean([METRICS['grad_norm_spikes'](r) for r in ok]))}"
        layers = ", ".join(
            str(int(v)) if math.isfinite(v) else "-" for v in (METRICS["max_grad_layer"](r) for r in runs)
        )
        rows.append(
            [
                g.label,
                runs[0].spec.label.split("@", 1)[0],
                f"{runs[0].spec.lr:g}",
                f"{len(ok)}/{len(runs)}"
                + (
                    ""
                    if len(ok) == len(runs)
                    else " (" + ", ".join(_diverged_cell(r) for r in runs if r.status != "ok") + ")"
                ),
                agg("val_loss", 4),
                agg("train_loss", 4),
                agg("magnitude"),
                agg("variance"),
                agg("median_magnitude"),
                agg("magnitude_top2_removed"),
                agg("magnitude_slope"),
                spikes,
                layers,
                agg("last_attn_entropy"),
                agg("saturation") if any(math.isfinite(METRICS["saturation"](r)) for r in ok) else "-",
            ]
        )
    return _table(GROUP_COLUMNS, rows)


def lr_table(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> str:
    """Final validation loss of every first-seed selection run: candidates (rows) x learning rates; the chosen
    cell in bold; diverged runs give the step of divergence."""
    lrs = sorted({r.spec.lr for r in results if seed_index(r) == 0})
    rows = []
    for g in groups:
        for v in g.candidates:
            cells = []
            for lr in lrs:
                r = next(
                    (
                        x
                        for x in results
                        if x.spec.group == g.label
                        and seed_index(x) == 0
                        and x.spec.lr == lr
                        and x.spec.label.split("@", 1)[0] == v.label
                    ),
                    None,
                )
                if r is None:
                    cells.append("-")
                elif r.status == "diverged":
                    cells.append(f"diverged @{r.diverged_step}")
                elif r.status == "error":
                    cells.append("error")
                else:
                    text = _num(r.val_loss, 4)
                    cells.append(f"**{text}**" if chosen.get(g.label) == r.spec.label else text)
            rows.append([g.label, v.label] + cells)
    return _table(["scheme", "candidate"] + [f"lr {lr:g}" for lr in lrs], rows)


def budget_lines(
    results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str], meta: dict[str, Any]
) -> list[str]:
    """How far training got: the schemes' mean validation loss against the unigram loss of the same tokens."""
    unigram = meta.get("unigram_loss")
    means = {
        g.label: _mean(list(per_seed(group_runs(results, g.label, chosen.get(g.label)), "val_loss").values()))
        for g in groups
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
    first = [r for r in results if seed_index(r) == 0]
    diverged = sorted({(r.spec.label.split("@", 1)[0], r.spec.lr) for r in first if r.status == "diverged"})
    if not diverged:
        top = max((r.spec.lr for r in first), default=math.nan)
        return f"Divergence edge: no selection run diverged, so the edge lies above the grid's largest LR ({top:g})."
    edge: dict[str, float] = {}
    for label, lr in diverged:
        edge[label] = min(lr, edge.get(label, math.inf))
    listed = ", ".join(f"{label} from lr {lr:g}" for label, lr in edge.items())
    return f"Divergence edge (lowest diverging learning rate of the grid): {listed}; the others trained at every LR."


def importance_table(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> str:
    """Layer importance: validation-loss increase when one block is skipped, mean over seeds, summarised by
    depth quarter, with the number of blocks whose removal costs less than 0.01 nats."""
    rows = []
    for g in groups:
        runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok" and r.importance]
        if not runs:
            continue
        n = min(len(r.importance) for r in runs)
        mean = [_mean([r.importance[i] for r in runs]) for i in range(n)]
        q = max(1, n // 4)
        quarters = [mean[i * q : (i + 1) * q] if i < 3 else mean[3 * q :] for i in range(4)]
        rows.append(
            [g.label, str(len(runs))]
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


def approximation_table(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> str:
    """Where BHyT and BHyT* part: per BHyT-family group, site B's approximated over exact second moment
    (``bhyt_moment_ratio``; 1 = exact) in the first 4 layers and the rest, over positions 0-7 and later, and
    the last-layer magnitude and variance as a ratio to BHyT*'s (seed-paired, exp of the mean ln ratio)."""
    star = _find(groups, "BHyT*")
    family = [g for g in groups if _role(g) in BHYT_FAMILY]
    if not family:
        return "(no BHyT run)"

    def ln_values(g: Any, metric: str) -> dict[int, float]:
        v = per_seed(group_runs(results, g.label, chosen.get(g.label)), metric)
        return {k: math.log(x) if x > 0 else math.nan for k, x in v.items()}

    rows = []
    for g in family:
        runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok"]
        if not runs:
            continue

        def ratio(stat: str, lo: int, hi: int | None) -> str:
            """Mean over the layers ``lo <= i < hi`` (0-based) that have the statistic, then over seeds."""
            per_run = []
            for r in runs:
                layers = {
                    split[1]: v
                    for k, v in r.depth_final.items()
                    if (split := split_layer_key(k)) is not None and split[0] == stat
                }
                per_run.append(_mean([v for i, v in layers.items() if i >= lo and (hi is None or i < hi)]))
            return _num(_mean(per_run))

        cells = [g.label, ratio("bhyt_moment_ratio", 0, 4), ratio("bhyt_moment_ratio", 4, None)]
        cells += [ratio("bhyt_moment_ratio_first8", 0, None), ratio("bhyt_moment_ratio_rest", 0, None)]
        for stat in ("magnitude", "variance"):
            if star is None or g is star:
                cells.append("-")
                continue
            d = stats.interval(stats.paired_differences(ln_values(g, stat), ln_values(star, stat)))
            cells.append(f"{_num(math.exp(d.mean))} [{_num(math.exp(d.low))}, {_num(math.exp(d.high))}]")
        rows.append(cells)
    header = ["scheme", "moment ratio, layers 1-4", "layers 5-L", "positions 0-7", "positions 8+"]
    header += ["last-layer magnitude / BHyT* [95% CI]", "last-layer variance / BHyT* [95% CI]"]
    return _table(header, rows)


# ----------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Claim:
    """One tested claim: what is compared, the seed-paired difference, the verdict, and (``room``) the
    distance from the mean difference to the decision boundary in the paper's favour."""

    claim: str
    comparison: str
    difference: stats.Interval
    verdict: stats.Verdict
    room: float = math.nan

    @property
    def seeds_needed(self) -> int | None:
        """Seeds for a decisive interval at the measured mean and spread (inconclusive claims only)."""
        if self.verdict.label != stats.INCONCLUSIVE:
            return None
        return stats.seeds_needed(self.difference, self.room)


def _find(groups: Sequence[Any], role: str, predicate: Callable[[dict[str, Any]], bool] = lambda a: True) -> Any:
    """The first group playing ``role`` whose candidates' norm arguments all satisfy ``predicate``."""
    return next((g for g in groups if _role(g) == role and all(predicate(v.norm_args) for v in g.candidates)), None)


def claims(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> list[Claim]:
    """The paper's claims testable at this scale (docs/method.md), each with its verdict rule:
    lowest last-layer magnitude and variance (BHyT vs every baseline, on ``ln``), loss no worse than RMSNorm
    (margin +0.02 nats), BHyT ~ BHyT* (+-0.05 nats; +-0.05 in ``ln`` for depth statistics), the 1B eval-loss
    ordering BHyT < LNS < RMSNorm < Peri-LN < DyT (adjacent pairs), and the variance theorem (BHyT vs LNS
    last-layer variance where lambda/kappa < 1/sqrt(L) holds; outside the theorem where it fails)."""

    def values(group: Any, metric: str) -> dict[int, float]:
        v = per_seed(group_runs(results, group.label, chosen.get(group.label)), metric)
        return {
            k: math.log(x) if metric in LOG_METRICS and x > 0 else (x if metric not in LOG_METRICS else math.nan)
            for k, x in v.items()
        }

    def diff(a: Any, b: Any, metric: str) -> stats.Interval:
        return stats.interval(stats.paired_differences(values(a, metric), values(b, metric)))

    plain = lambda a: "exact_layers" not in a  # noqa: E731
    bhyt_groups = [g for g in groups if _role(g) == "BHyT" and all(plain(v.norm_args) for v in g.candidates)]
    bhyt = bhyt_groups[0] if bhyt_groups else None
    star = _find(groups, "BHyT*")
    exact_layers = next(
        (g for g in groups if _role(g) == "BHyT" and not all(plain(v.norm_args) for v in g.candidates)), None
    )
    base = {role: _find(groups, role) for role in ("RMSNorm", "LayerNorm", "LNS", "Peri-LN", "DyT")}
    out: list[Claim] = []
    if bhyt is not None:
        for stat in ("magnitude", "variance"):
            for name, other in base.items():
                if other is not None:
                    d = diff(bhyt, other, stat)
                    out.append(
                        Claim(
                            f"BHyT has the lowest last-layer {stat}",
                            f"ln {bhyt.label} - ln {other.label}",
                            d,
                            stats.verdict_direction(d, -1),
                            -d.mean,
                        )
                    )
        for g in bhyt_groups:
            if base["RMSNorm"] is not None:
                d = diff(g, base["RMSNorm"], "val_loss")
                out.append(
                    Claim(
                        "BHyT's loss is no worse than RMSNorm's",
                        f"val loss {g.label} - rmsnorm",
                        d,
                        stats.verdict_no_worse(d),
                        0.02 - d.mean,
                    )
                )
    for g in [x for x in (bhyt, exact_layers) if x is not None]:
        if star is not None:
            d = diff(g, star, "val_loss")
            out.append(
                Claim(
                    "BHyT ~ BHyT* in loss",
                    f"val loss {g.label} - {star.label}",
                    d,
                    stats.verdict_approx(d),
                    0.05 - abs(d.mean),
                )
            )
            for stat in ("magnitude", "variance"):
                d = diff(g, star, stat)
                out.append(
                    Claim(
                        f"BHyT ~ BHyT* in last-layer {stat}",
                        f"ln {g.label} - ln {star.label}",
                        d,
                        stats.verdict_approx(d),
                        0.05 - abs(d.mean),
                    )
                )
    order = [bhyt, base["LNS"], base["RMSNorm"], base["Peri-LN"], base["DyT"]]
    names = ["BHyT", "LNS", "RMSNorm", "Peri-LN", "DyT"]
    for (a, na), (b, nb) in zip(zip(order, names), zip(order[1:], names[1:]), strict=False):
        if a is not None and b is not None:
            d = diff(a, b, "val_loss")
            out.append(
                Claim(
                    f"1B eval-loss ordering: {na} < {nb}",
                    f"val loss {a.label} - {b.label}",
                    d,
                    stats.verdict_direction(d, -1),
                    -d.mean,
                )
            )
    if base["LNS"] is not None:
        for g in [x for x in groups if _role(x) in BHYT_FAMILY]:
            runs = group_runs(results, g.label, chosen.get(g.label))
            bound = next((r.variance_bound for r in runs if r.variance_bound), None)
            if not bound:
                continue
            d = diff(g, base["LNS"], "variance")
            k, n = bound["kappa"], bound["n_layers"]
            lam = max(bound["lambda_attn"], bound["lambda_mlp"])
            relation = "<" if bound["at_init"]["all"] else ">="
            condition = f"lambda/kappa = {lam / k:.3g} {relation} 1/sqrt({n}) = {1 / math.sqrt(n):.3g}"
            if bound["at_init"]["all"]:
                verdict = stats.verdict_direction(d, -1)
            else:
                verdict = stats.Verdict("outside the theorem", "the condition fails: no prediction, numbers only")
            out.append(
                Claim(
                    f"theorem: BHyT variance below LNS's ({condition})",
                    f"ln {g.label} - ln {base['LNS'].label} (last-layer variance)",
                    d,
                    verdict,
                    -d.mean,
                )
            )
    return out


def verdict_summary(items: Sequence[Claim]) -> list[str]:
    """One line per verdict with the comparisons that received it (the report's plain summary)."""
    lines = []
    for label in (stats.REPRODUCED, stats.NOT_REPRODUCED, stats.INCONCLUSIVE, "outside the theorem"):
        chosen_items = [c for c in items if c.verdict.label == label]
        if chosen_items:
            listed = "; ".join(f"{c.claim} ({c.comparison})" for c in chosen_items)
            lines.append(f"- **{label}** ({len(chosen_items)}/{len(items)}): {listed}")
    return lines


def claims_table(items: Sequence[Claim]) -> str:
    """The claims with their intervals and verdicts; for an inconclusive claim, the seeds a decisive interval
    would need if the mean and spread stayed as measured ("-": the mean is on the wrong side or the spread
    undefined)."""
    rows = [
        [
            c.claim,
            c.comparison,
            str(c.difference.n),
            _ci(c.difference),
            f"**{c.verdict.label}**",
            c.verdict.rule,
            str(c.seeds_needed) if c.seeds_needed else "-",
        ]
        for c in items
    ]
    header = ["claim", "seed-paired difference", "pairs", "mean [95% CI] (min-max)", "verdict", "rule"]
    header.append("seeds for a decisive CI")
    return _table(header, rows) if rows else "(no claim testable with these schemes)"


# ----------------------------------------------------------------------------- figures
def _color(groups: Sequence[Any], label: str) -> Any:
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


def depth_profile_figure(
    results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str], title: str
) -> Any:
    """Paper Figure 3 and its robust variants against depth at the end: mean over seeds with a min-max band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    stats_ = ("magnitude", "variance", "median_magnitude", "magnitude_top2_removed")
    figure = Figure(figsize=(13, 8), layout="constrained")
    axes = figure.subplots(2, 2).ravel()
    for ax, stat in zip(axes, stats_, strict=True):
        for g in groups:
            runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok"]
            series = [layer_series(r.depth_final, stat) for r in runs]
            series = [s for s in series if s]
            if series:
                _band(ax, range(1, len(series[0]) + 1), series, g.label, _color(groups, g.label))
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer (block output)")
        ax.set_title(stat.replace("_", " "))
        ax.grid(alpha=0.3, which="both")
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(title)
    return figure


def trajectory_figure(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str], title: str) -> Any:
    """Last-layer magnitude, median-token magnitude, log-magnitude slope and tanh saturation against the
    optimizer step: mean over seeds with a min-max band."""
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
        for g in groups:
            runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok" and r.trajectory]
            if not runs:
                continue
            steps = [p["step"] for p in runs[0].trajectory]
            series = [[fn(p) for p in r.trajectory] for r in runs]
            _band(ax, steps, series, g.label, _color(groups, g.label))
        if log_scale:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    figure.suptitle(title)
    return figure


def lr_figure(results: Sequence[RunResult], groups: Sequence[Any], max_loss: float) -> Any:
    """Validation loss against learning rate on the first seed, one line per candidate; a diverged run is an
    'x' at the top of the plot (the divergence edge)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    first = [r for r in results if seed_index(r) == 0]
    finite = [r.val_loss for r in first if r.status == "ok" and math.isfinite(r.val_loss)]
    top = max(finite) + 0.1 if finite else max_loss
    for g in groups:
        for v in g.candidates:
            runs = sorted(
                (r for r in first if r.spec.group == g.label and r.spec.label.split("@", 1)[0] == v.label),
                key=lambda r: r.spec.lr,
            )
            if not runs:
                continue
            ok = [r for r in runs if r.status == "ok"]
            (line,) = ax.plot(
                [r.spec.lr for r in ok], [r.val_loss for r in ok], marker="o", markersize=3, label=v.label
            )
            bad = [r.spec.lr for r in runs if r.status != "ok"]
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


def importance_figure(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str]) -> Any:
    """Validation-loss increase when each block alone is replaced by the identity, mean with a seed band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(9, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in groups:
        runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok" and r.importance]
        if runs:
            _band(
                ax,
                range(1, len(runs[0].importance) + 1),
                [r.importance for r in runs],
                g.label,
                _color(groups, g.label),
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


def loss_figure(results: Sequence[RunResult], groups: Sequence[Any], chosen: dict[str, str], title: str) -> Any:
    """Training loss against step over the seeds of each group (mean with a min-max band)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.8), layout="constrained")
    ax = figure.subplots()
    for g in groups:
        runs = [r for r in group_runs(results, g.label, chosen.get(g.label)) if r.status == "ok" and r.losses]
        if runs:
            _band(
                ax,
                [s for s, _ in runs[0].losses],
                [[v for _, v in r.losses] for r in runs],
                g.label,
                _color(groups, g.label),
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    return figure


# ----------------------------------------------------------------------------- the report
def write_report(
    out: Path,
    results: list[RunResult],
    meta: dict[str, Any],
    groups: Sequence[Any],
    chosen: dict[str, str],
    sweep: bool,
    figures: bool = True,
) -> dict[str, Path]:
    """``results.json`` (every run of every seed), ``report.md`` and (``figures``) the PNGs under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "report": out / "report.md"}
    document = {"meta": meta, "chosen": chosen, "runs": [r.to_dict() for r in results]}
    if not sweep:
        document["claims"] = [
            {
                "claim": c.claim,
                "comparison": c.comparison,
                "difference": c.difference.__dict__,
                "verdict": c.verdict.label,
                "rule": c.verdict.rule,
                "seeds_needed": c.seeds_needed,
            }
            for c in claims(results, groups, chosen)
        ]
    paths["results"].write_text(json.dumps(document, indent=1, default=str))
    max_loss = float(meta["max_loss"])
    title = (
        f"{meta['preset']} ({meta['n_layers_label']} layers), {meta['steps']} steps of {meta['tokens_per_step']} tokens"
    )
    lines = [f"# {'Stability sweep' if sweep else 'Depth study'}", "", f"Command: `{meta['command']}`", ""]
    skip = ("command", "machine", "n_layers_label", "overrides")
    lines += [f"- {k.replace('_', ' ')}: {v}" for k, v in meta.items() if k not in skip]
    lines.append(f"- layers: {meta['n_layers_label']}; config overrides: {meta.get('overrides') or 'none'}")
    lines.append("- machine: " + ", ".join(f"{k} {v}" for k, v in meta["machine"].items()))
    lines.append("")
    if sweep:
        if figures:
            paths["grid"] = save_figure(sweep_figure(results, max_loss), out / "sweep_grid.png")
        lines += [
            f"Final training loss (mean of the last 10% of steps); **diverged**: loss NaN/inf or > {max_loss:.3g} "
            "at that step.",
            "",
            sweep_table(results),
            "",
            "![stability grid](sweep_grid.png)",
        ]
        paths["report"].write_text("\n".join(lines) + "\n")
        return paths
    if figures:
        paths["depth_final"] = save_figure(
            depth_profile_figure(results, groups, chosen, f"end of training: {title}"), out / "depth_final.png"
        )
        paths["trajectories"] = save_figure(trajectory_figure(results, groups, chosen, title), out / "trajectories.png")
        paths["lr"] = save_figure(lr_figure(results, groups, max_loss), out / "lr_sensitivity.png")
        paths["importance"] = save_figure(importance_figure(results, groups, chosen), out / "layer_importance.png")
        paths["loss"] = save_figure(loss_figure(results, groups, chosen, title), out / "loss.png")
    lines += [
        "## Claims",
        "",
        "Each row compares two schemes through the seed-paired difference (seed i of both shares the "
        "initialisation seed and the data order) at each scheme's chosen learning rate; magnitudes and "
        "variances as ln ratios. Verdicts: directional claims are *reproduced* when the 95% t-interval "
        "excludes 0 in the paper's direction, *not reproduced* when it excludes 0 in the other, else "
        '*inconclusive*; "no worse than": upper bound < +0.02 nats; "~": the interval within +-0.05.',
        "",
        claims_table(claims(results, groups, chosen)),
        "",
        *verdict_summary(claims(results, groups, chosen)),
        "",
        "## Schemes at their chosen learning rate",
        "",
        "mean [95% t-interval] (min-max) over seeds; diverged runs are left out of the means. Last layer: "
        "the last block's output on the fixed batch in eval mode at the end. Median-token magnitude: "
        "median over tokens of ||y_t||, position 0 excluded; w/o top-2 channels: the two channels with the "
        "largest mean |y| dropped. Spikes, layer of max grad norm (1-based, per seed) and attention entropy "
        "(nats) from StabilityMonitor on the training batch at its last logging step.",
        "",
        group_table(results, groups, chosen),
        "",
        *budget_lines(results, groups, chosen, meta),
        "",
        "## Learning-rate sensitivity (first seed, validation loss; bold: chosen)",
        "",
        lr_table(results, groups, chosen),
        "",
        divergence_edge(results),
        "",
        "![LR sensitivity](lr_sensitivity.png)",
        "",
        "## Layer importance (loss increase on the first validation batch when one block is replaced by the identity)",
        "",
        importance_table(results, groups, chosen),
        "",
        "![layer importance](layer_importance.png)",
        "",
        "## BHyT against BHyT* (the variance approximation of site B)",
        "",
        "Moment ratio: site B's approximated second moment over the exact one (1 = exact; below 1 the "
        "approximation under-predicts and site B's tanh argument grows), mean over layers, positions and seeds; "
        "n/a where site B is exact (BHyT*, exact_layers).",
        "",
        approximation_table(results, groups, chosen),
        "",
        "## Theorem condition lambda/kappa < 1/sqrt(L) (BHyT runs)",
        "",
        bound_table([r for g in groups for r in group_runs(results, g.label, chosen.get(g.label))]),
        "",
        "## Figures",
        "",
        "![depth profile at the end](depth_final.png)",
        "",
        "![trajectories](trajectories.png)",
        "",
        "![training loss](loss.png)",
    ]
    paths["report"].write_text("\n".join(lines) + "\n")
    return paths

"""The token-budget map's document, from its record alone: ``report.md`` and its figures (docs/token_budget.md).

Every number is read from the runs through ``bhyt_pl.study.protocol.token_budget_effects``; the rules it applies
(the schedule, the rate selection per budget, the early point, the saturation cut, the crossover's fit) are stated
in the report beside the numbers they produce.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bhyt_pl.study.protocol.metrics import PHASE_NAMES, PHASES
from bhyt_pl.study.protocol.size import RunSize
from bhyt_pl.study.protocol.spec import RunResult, RunStatus
from bhyt_pl.study.protocol.stats import Interval
from bhyt_pl.study.protocol.token_budget import EARLY_FRACTION, EARLY_MIN_STEP, BudgetDesign
from bhyt_pl.study.protocol.token_budget_effects import (
    DEPTH_METRICS,
    POWER,
    SATURATION_CUT,
    BudgetEffect,
    Crossover,
    budget_effects,
    crossover,
    saturation_rule,
    sign_changes,
)
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.report.exploration import failed_runs_lines, meta_lines, partial_lines
from bhyt_pl.study.report.figures import save_figure
from bhyt_pl.study.report.markdown import markdown_table, num, short_ci

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["crossovers", "effects_figure", "sections", "write_report"]


def _design(record: StudyRecord) -> BudgetDesign:
    if record.budgets is None:
        raise ValueError("a token-budget record has a 'budgets' design; this one has none")
    return record.budgets


def crossovers(design: BudgetDesign, effects: Sequence[BudgetEffect]) -> dict[str, Crossover]:
    """Each scheme's crossover of its loss difference along ln T/P (``token_budget_effects.crossover``)."""
    out = {}
    ratios = [b.ratio for b in design.budgets]
    for group in design.groups:
        mine = [e for e in effects if e.group == group.label]
        if not mine:
            continue
        per_seed: dict[int, dict[float, float]] = {}
        for e in mine:
            for seed, d in e.per_seed.items():
                per_seed.setdefault(seed, {})[e.budget.ratio] = d
        out[group.label] = crossover(ratios, per_seed)
    return out


def sections(record: StudyRecord) -> dict[str, object]:
    """The evaluated map beside the runs in ``results.json`` (a reader's copy; the report recomputes it)."""
    design = _design(record)
    effects = budget_effects(design, record.runs)
    rule = saturation_rule(effects)

    def iv(i: Interval) -> dict[str, float | int]:
        return {"n": i.n, "mean": i.mean, "low": i.low, "high": i.high}

    return {
        "effects": [
            {
                "budget": e.budget.ratio,
                "group": e.group,
                "lr": e.lr,
                "val_loss_difference": iv(e.loss),
                "minimum_detectable_difference": e.mdd,
                "train_val_gap": iv(e.gap),
                "saturation_early": iv(e.saturation_early),
                "saturation_end": iv(e.saturation_end),
                "validation_noise_se": e.val_noise_se,
                "arms": {a.metric: {p: iv(a.phases.at(p)) for p in PHASES} | {"origin": a.origin} for a in e.arms},
            }
            for e in effects
        ],
        "crossovers": {
            g: {"estimate": c.estimate, "low": c.low, "high": c.high, "status": c.status, "slope": c.slope}
            for g, c in crossovers(design, effects).items()
        },
        "saturation_rule": {
            "cut": SATURATION_CUT,
            "cells": len(rule.cells),
            "accuracy": rule.accuracy,
            "decided_cells": len(rule.decided),
            "decided_accuracy": rule.decided_accuracy,
            "wrong": [f"{c.group} at T/P {c.budget.label}" for c in rule.wrong],
        },
    }


def _rate(lr: float) -> str:
    return "-" if not math.isfinite(lr) else f"{lr:g}"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _size_table(design: BudgetDesign, meta: Mapping[str, object], runs: Sequence[RunResult]) -> str:
    sizes = meta.get("size") if isinstance(meta.get("size"), Mapping) else {}
    rows = []
    for b in design.budgets:
        entry = sizes.get(b.label) if isinstance(sizes, Mapping) else None
        size = RunSize.from_dict(entry) if isinstance(entry, Mapping) else None
        done = [r for r in runs if r.spec.steps == b.steps and r.status == RunStatus.OK]
        measured = done[0].tokens_per_param if done else math.nan
        rows.append(
            [
                b.label,
                f"{b.steps:,}",
                f"{size.tokens:,}" if size else "-",
                num(size.tokens_per_param if size else math.nan, 3),
                num(measured, 3),
                f"{size.block_params:,}" if size else "-",
                f"{size.embedding_params:,}" if size else "-",
                num(size.epochs, 3) if size and size.epochs is not None else "-",
                str(b.early_step),
            ]
        )
    header = ["T/P asked", "steps", "tokens", "T/P (P)", "T/P (a run)", "P", "embedding", "epochs", "early step"]
    return markdown_table(header, rows)


def _selection_table(design: BudgetDesign) -> str:
    rows = []
    for g in design.groups:
        cells = [g.label, ", ".join(f"{lr:g}" for lr in design.grids[g.label])]
        for b in design.budgets:
            s = design.selection(b, g.label)
            if s is None:
                cells.append("pending")
                continue
            text = "none trained" if s.chosen is None else _rate(s.lr)
            if s.edge:
                text += f" (**{s.edge} rate tried**)"
            if design.donor(b) is not b:
                text += f" (from T/P {design.donor(b).label})"
            cells.append(text)
        rows.append(cells)
    return markdown_table(["group", "grid", *[f"T/P {b.label}" for b in design.budgets]], rows)


def _verdict(e: BudgetEffect) -> str:
    if not e.loss.defined:
        return "n/a (fewer than 2 pairs)"
    if e.loss.high < 0:
        return "lower"
    if e.loss.low > 0:
        return "higher"
    return "not decided"


def _loss_table(effects: Sequence[BudgetEffect]) -> str:
    rows = [
        [
            e.budget.label,
            e.group,
            _rate(e.lr),
            _rate(e.reference_lr),
            short_ci(e.loss),
            num(e.mdd, 3),
            str(e.loss.n),
            num(e.val_noise_se, 2),
            num(e.loss.sd, 2),
            _verdict(e),
        ]
        for e in effects
    ]
    header = ["T/P", "scheme", "lr", "reference lr", "difference [95 % CI]", f"MDD at {POWER:.0%}", "pairs",
              "validation SE", "seed SD", "verdict"]  # fmt: skip
    return markdown_table(header, rows)


def _crossover_lines(design: BudgetDesign, effects: Sequence[BudgetEffect]) -> list[str]:
    lines = []
    ratios = [b.ratio for b in design.budgets]
    fits = crossovers(design, effects)
    rows = []
    for g in design.groups:
        mine = {e.budget.ratio: e.loss for e in effects if e.group == g.label}
        if not mine or g.label not in fits:
            continue
        present = [r for r in ratios if r in mine]
        changes = sign_changes(present, [mine[r] for r in present])
        c = fits[g.label]
        interval_text = (
            "none: the seeds' interval excludes 0 over the whole range"
            if c.low is None
            else f"[{_ratio_text(c.low)}{' or below' if c.open_low else ''}, "
            f"{_ratio_text(c.high)}{' or above' if c.open_high else ''}]"
        )
        rows.append(
            [
                g.label,
                ", ".join(f"between T/P {a:g} and {b:g}" for a, b in changes) or "none",
                _ratio_text(c.estimate),
                interval_text if c.low is not None or c.seeds >= 2 else "-",
                num(c.slope, 3),
                c.status,
            ]
        )
    if not rows:
        return []
    lines.append(
        markdown_table(
            [
                "scheme",
                "sign change between budgets (95 % CIs on both sides of 0)",
                "fitted crossover T/P",
                "T/P where the seeds' lines cover 0",
                "slope (nats per ln T/P)",
                "status",
            ],
            rows,
        )  # fmt: skip
    )
    return lines


def _gap_table(design: BudgetDesign, effects: Sequence[BudgetEffect], runs: Sequence[RunResult]) -> str:
    from bhyt_pl.study.protocol.stats import interval

    rows = []
    for b in design.budgets:
        for g in design.groups:
            seeds = design.evaluation_runs(runs, b, g.label)
            if not seeds:
                continue
            gap = interval([r.val_loss - r.train_loss for r in seeds.values()])
            val = interval([r.val_loss for r in seeds.values()])
            train = interval([r.train_loss for r in seeds.values()])
            epochs = next((r.epochs for r in seeds.values() if r.epochs is not None), None)
            rows.append([b.label, g.label, short_ci(train), short_ci(val), short_ci(gap), num(epochs, 3)])
    return markdown_table(["T/P", "scheme", "train loss (last 10 %)", "validation loss", "gap (val - train)",
                           "epochs"], rows)  # fmt: skip


def _arms_table(effects: Sequence[BudgetEffect]) -> str:
    rows = []
    for e in effects:
        for a in e.arms:
            rows.append([e.budget.label, e.group, DEPTH_METRICS[a.metric],
                         *[short_ci(a.phases.at(p)) for p in PHASES], a.origin])  # fmt: skip
    return markdown_table(["T/P", "scheme", "metric", *[PHASE_NAMES[p] for p in PHASES], "reads"], rows)


def _saturation_table(design: BudgetDesign, effects: Sequence[BudgetEffect], runs: Sequence[RunResult]) -> str:
    rows = []
    for e in effects:
        if e.saturation_end.n == 0:
            continue
        runs_by_seed = design.evaluation_runs(runs, e.budget, e.group)
        sites = _site_saturation(list(runs_by_seed.values()))
        rows.append([e.budget.label, e.group, f"{e.budget.early_step}", short_ci(e.saturation_early),
                     short_ci(e.saturation_end), sites or "-"])  # fmt: skip
    return markdown_table(["T/P", "scheme", "early step", "saturation at the early step", "at the end",
                           "at the end, by site"], rows)  # fmt: skip


def _site_saturation(runs: Sequence[RunResult]) -> str:
    """The mean over runs and layers of each site's end saturation (``saturation/<site>/layer_<ii>``)."""
    by_site: dict[str, list[float]] = {}
    for r in runs:
        for key, v in r.depth_final.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "saturation" and math.isfinite(v):
                by_site.setdefault(parts[1], []).append(v)
    return ", ".join(f"{site} {sum(v) / len(v):.3f}" for site, v in sorted(by_site.items()))


def _rule_lines(effects: Sequence[BudgetEffect]) -> list[str]:
    rule = saturation_rule(effects)
    if not rule.cells:
        return ["No cell has a bounded site with a loss difference yet."]
    rows = [
        [c.group, c.budget.label, f"{c.early:.3f}", "lower" if c.predicted < 0 else "higher", short_ci(c.loss),
         "lower" if c.observed < 0 else "higher", "yes" if c.decided else "no", "right" if c.correct else "**wrong**"]
        for c in rule.cells
    ]  # fmt: skip
    wrong = ", ".join(f"{c.group} at T/P {c.budget.label}" for c in rule.wrong) or "none"
    decided = (
        f"{num(rule.decided_accuracy, 3)} over the {len(rule.decided)} cells whose interval excludes 0"
        if rule.decided
        else "no cell's interval excludes 0"
    )
    return [
        markdown_table(
            [
                "scheme",
                "T/P",
                "early saturation",
                "predicted loss vs reference",
                "difference [95 % CI]",
                "observed",
                "decided",
                "rule",
            ],
            rows,
        ),  # fmt: skip
        "",
        f"Accuracy: {sum(c.correct for c in rule.cells)} of {len(rule.cells)} cells ({num(rule.accuracy, 3)}); "
        f"{decided}. Wrong: {wrong}.",
    ]


def effects_figure(design: BudgetDesign, effects: Sequence[BudgetEffect]) -> Figure:
    """Three panels over T/P (log axis): the loss difference to the reference with its 95 % intervals, the early and
    end saturation, and the made-by-training arm of the ln median-token magnitude."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 4.2))
    axes = figure.subplots(1, 3)
    palette = colormaps["tab10"]
    groups = [g.label for g in design.groups if g.label != design.reference]
    panels = [
        (axes[0], lambda e: e.loss, f"validation loss - {design.reference} (nats)"),
        (axes[1], lambda e: e.saturation_end, "tanh saturation at the end (|arg| > 2)"),
        (axes[2], lambda e: e.arms[0].phases.training, "made by training: ln median-token magnitude diff"),
    ]
    for ax, read, title in panels:
        for i, g in enumerate(groups):
            mine = [e for e in effects if e.group == g and read(e).n > 0]
            if not mine:
                continue
            x = [e.budget.ratio * (1 + 0.04 * (i - 1)) for e in mine]  # a small offset keeps the bars apart
            ivs = [read(e) for e in mine]
            y = [iv.mean for iv in ivs]
            low = [iv.mean - iv.low if iv.defined else 0.0 for iv in ivs]
            high = [iv.high - iv.mean if iv.defined else 0.0 for iv in ivs]
            ax.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=g, color=palette(i % palette.N))
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("tokens per parameter (T/P, P = block matrices)")
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    return figure


def _rules_lines(design: BudgetDesign, meta: Mapping[str, object]) -> list[str]:
    inherit = (
        "every budget selects its own rates"
        if design.select_through == len(design.budgets)
        else f"the {design.select_through} smallest budgets select their rates; each larger budget inherits the "
        f"rate its group chose at T/P {design.selected_budgets[-1].label}"
    )
    return [
        "## Rules fixed before the runs",
        "",
        "- Budgets: each T/P is a full run with its own schedule: linear warmup over the scheme's warmup fraction of "
        "its steps (0.05 unless the scheme's recipe says otherwise), cosine decay to 0.1 x the peak rate at its last "
        "step; AdamW weight decay 0.1 on the weight matrices for every scheme (decay regularises too: it is the same "
        "for all, so it is not what differs between them); batch size and sequence length the same at every budget.",
        f"- Rates: chosen per budget on the selection seed (index 0, never an evaluation seed) from each group's grid "
        f"by validation loss, extended up to {design.extensions} grid step(s) past an edge; a pick still at an edge "
        f"is flagged. {inherit[0].upper() + inherit[1:]}.",
        f"- Seeds: {design.n_seeds} evaluation seeds per group and budget (indices 1..{design.n_seeds}); seed i "
        "initialises the model and orders the data, the same for every scheme (pairs).",
        "- Loss difference: validation loss, scheme minus reference, paired per seed; paired-t 95 % interval; the "
        f"minimum detectable difference is the true difference a two-sided paired t-test at 0.05 finds with "
        f"{POWER:.0%} power at the pairs it has and their SD (noncentral t).",
        "- Crossover: one least-squares line per seed through its differences against ln T/P; the fit is their mean "
        "line, the interval every T/P in the range where the seeds' 95 % t-interval of the line covers 0. *crosses*: "
        "the mean line crosses 0 inside the range and the interval lies inside it; *crosses, not located*: it crosses "
        "inside, but the interval reaches an end of the range, so the seeds establish neither where nor whether it "
        "crosses; *no sign change*: the mean line keeps one sign over the range.",
        f"- Early point: {EARLY_FRACTION:.0%} of a run's steps, never before step {EARLY_MIN_STEP}; the saturation "
        "statistic is the fraction of a bounded site's arguments with |argument| > 2 (mean over sites and layers) on "
        f"the validation batches. Rule: early saturation >= {SATURATION_CUT:g} predicts a lower loss than the "
        f"reference, below it a higher one ({SATURATION_CUT:g}: midway between the 0.49 and 0.23 that arXiv "
        "2604.23434 measured where DyT helped and where it hurt; nothing here is fitted on the cells it scores).",
        f"- Validation: {meta.get('validation', '?')}.",
    ]


def write_report(out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
    """``report.md`` and (``figures``) ``token_budget.png`` under ``out``, from ``record`` alone."""
    out.mkdir(parents=True, exist_ok=True)
    design, meta, runs = _design(record), record.meta, record.runs
    effects = budget_effects(design, runs)
    paths = {"report": out / "report.md"}
    if figures and effects:
        paths["figure"] = save_figure(effects_figure(design, effects), out / "token_budget.png")
    skip = ("command", "size", "validation", "partial")
    lines = [
        "# Token-budget map",
        "",
        *partial_lines(meta, "map"),
        f"Command: `{meta.get('command', '?')}`",
        "",
        *meta_lines(meta, skip),
        "",
        "Each scheme against "
        f"`{design.reference}` at {len(design.budgets)} budgets of training tokens per block-matrix parameter (T/P), "
        "each budget a full run with its own schedule; see the rules below.",
        "",
        "## Budgets and the size of their runs",
        "",
        _size_table(design, meta, runs),
        "",
        *_rules_lines(design, meta),
        "",
        "## Rates chosen per budget (selection seed)",
        "",
        _selection_table(design),
        "",
        f"## Validation loss against {design.reference}",
        "",
        "Difference = scheme - reference, nats; negative: the scheme reaches a lower loss. *validation SE*: the part "
        "of a pair's difference that the validation tokens carry (SD of the per-batch differences / sqrt(batches), "
        "mean over seeds), beside the seeds' SD of the difference.",
        "",
        _loss_table(effects) if effects else "No budget has both the reference's and a scheme's evaluation runs yet.",
        "",
        "## Where the difference changes sign",
        "",
        *(_crossover_lines(design, effects) or ["Not enough budgets with evaluation runs yet."]),
        "",
        "## Train-validation gap",
        "",
        _gap_table(design, effects, runs),
        "",
        "## Depth claims: at initialisation, at the end, made by training",
        "",
        "Scheme minus reference per seed, on the metric's ln scale; *made by training* is the end minus step 0 "
        "(docs/method.md, section 10). A difference present at step 0 is the scheme's construction, not what "
        "training made.",
        "",
        _arms_table(effects) if effects else "No comparison yet.",
        "",
        "## Tanh saturation",
        "",
        _saturation_table(design, effects, runs) if effects else "No comparison yet.",
        "",
        "## The early-saturation rule",
        "",
        *_rule_lines(effects),
        "",
        f"Unigram loss of the validation tokens (a model that learned token frequencies only): "
        f"{num(meta.get('unigram_loss'), 4) if isinstance(meta.get('unigram_loss'), float) else '-'} nats.",
        "",
        *failed_runs_lines(runs),
    ]
    if effects:  # the figure is drawn with the figures (at the end of a study, by --report-from)
        lines += ["![loss difference, saturation and the made-by-training arm over T/P](token_budget.png)", ""]
    paths["report"].write_text("\n".join(lines).rstrip() + "\n")
    return paths

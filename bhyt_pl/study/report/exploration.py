"""The study's report document: ``report.md`` put together from the tables (``bhyt_pl.study.report.tables``), the
figures (``bhyt_pl.study.report.figures``) and the prose between them, with the claims as evaluated
(``bhyt_pl.study.protocol.claims``, docs/method.md, section 10).

Rendering reads a ``StudyRecord`` and nothing else, and writes only the document and its figures (the record is saved
in ``bhyt_pl.study.record``), so ``python -m bhyt_pl study --report-from DIR`` rebuilds the report from
``DIR/results.json`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from bhyt_pl.study.protocol.claims import ClaimResult, ClaimSpec, evaluate
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns
from bhyt_pl.study.protocol.plan import SELECTION_SEED
from bhyt_pl.study.protocol.size import RunSize
from bhyt_pl.study.protocol.spec import RunResult, RunStatus
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.report.columns import finite_mean, per_seed
from bhyt_pl.study.report.figures import (
    FigureGroup,
    claims_figure,
    depth_profile_figure,
    importance_figure,
    loss_figure,
    lr_figure,
    save_figure,
    sweep_figure,
    trajectory_figure,
)
from bhyt_pl.study.report.markdown import markdown_table, num
from bhyt_pl.study.report.phases import DESCRIPTION as PHASES_DESCRIPTION
from bhyt_pl.study.report.phases import READINGS as PHASES_READINGS
from bhyt_pl.study.report.phases import phases_note
from bhyt_pl.study.report.tables import (
    GrowthRow,
    approximation_table,
    bound_table,
    depth_tests,
    design_table,
    detail_table,
    group_table,
    growth_margin,
    growth_rows,
    growth_table,
    growth_words,
    importance_table,
    lr_table,
    matched_table,
    phases_table,
    summary_table,
    sweep_table,
    training_table,
)

__all__ = [
    "budget_lines",
    "budget_note",
    "depth_runs",
    "depth_runs_words",
    "divergence_edge",
    "growth_prose",
    "invocations_text",
    "margins_lines",
    "meta_lines",
    "partial_lines",
    "verdict_counts",
    "write_report",
]


def depth_runs(runs: StudyRuns, design: StudyDesign, group: str) -> list[RunResult]:
    """The runs a depth figure shows for ``group``: at the highest matched rate when there is one (depth statistics
    grow with the learning rate, so profiles at different rates would compare the rates), else at its best rate."""
    return design.evaluation_runs(runs, group, design.depth_lr)


def depth_runs_words(design: StudyDesign) -> str:
    """Where ``depth_runs`` reads, for a figure's title."""
    return f"every scheme at lr {design.depth_lr:g} (matched)" if design.matched_lrs else "each scheme at its best lr"


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


def budget_lines(runs: StudyRuns, design: StudyDesign, meta: Mapping[str, object]) -> list[str]:
    """How far training got: the schemes' mean validation loss against the unigram loss of the same tokens."""
    unigram = meta.get("unigram_loss")
    if not isinstance(unigram, int | float):
        return []
    means = {
        g.label: finite_mean(list(per_seed(design.evaluation_runs(runs, g.label), "val_loss").values()))
        for g in design.groups
    }
    means = {k: v for k, v in means.items() if math.isfinite(v)}
    if not means:
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
    diverged = sorted({(r.spec.candidate, r.spec.lr) for r in first if r.status == RunStatus.DIVERGED})
    if not diverged:
        top = max((r.spec.lr for r in first), default=math.nan)
        return f"Divergence edge: no selection run diverged, so the edge lies above the largest LR tried ({top:g})."
    edge: dict[str, float] = {}
    for label, lr in diverged:
        edge[label] = min(lr, edge.get(label, math.inf))
    listed = ", ".join(f"{label} from lr {lr:g}" for label, lr in edge.items())
    return f"Divergence edge (lowest diverging learning rate tried): {listed}; the others trained at every LR."


def growth_prose(rows: Sequence[GrowthRow]) -> list[str]:
    """One sentence per scheme from the growth table: what its magnitude does from layer L/4 to L, per rate."""
    by_group: dict[str, list[str]] = {}
    for row in rows:
        m = row.intervals["magnitude_growth"]
        if not math.isfinite(m.mean):
            continue
        by_group.setdefault(row.label.split(" (edge: ", 1)[0], []).append(
            f"at lr {row.rate} the last layer's magnitude is {num(math.exp(m.mean))}x layer L/4's "
            f"(ln {num(m.mean)}): {growth_words(m)}"
        )
    return [f"- {group}: " + "; ".join(parts) + "." for group, parts in by_group.items()]


def margins_lines(items: Sequence[ClaimResult]) -> list[str]:
    margins = sorted({(c.spec.metric, c.spec.margin_value) for c in items if c.spec.margin_value is not None})
    if not margins:
        return []
    listed = ", ".join(f"{metric} +-{m:g}" for metric, m in margins)
    return [f"Margins (docs/method.md, section 10): {listed}."]


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


def partial_lines(meta: Mapping[str, object], what: str = "study") -> list[str]:
    """The marker at the top of the report of a study that has not finished (``meta["partial"]``: still running, or
    interrupted): how many runs are in, and that the rest of the report covers only those. Nothing once finished."""
    partial = meta.get("partial")
    if not isinstance(partial, Mapping) or not partial:
        return []
    planned = ("" if partial.get("planned_final", True) else "at least ") + str(partial.get("runs_planned", "?"))
    running = partial.get("state") == "running"
    state = "is still running" if running else "was interrupted before its last run"
    resume = "" if running else " The same command resumes it, reusing every finished run."
    return [
        f"**Partial: {partial.get('runs_done', '?')} of {planned} runs.** This {what} {state}: every table, claim "
        "and figure below covers only the runs that finished, so a verdict of n/a or inconclusive may only mean that "
        f"runs are missing.{resume}",
        "",
    ]


def invocations_text(invocations: Sequence[Mapping[str, object]]) -> str:
    """``meta["invocations"]`` in words: how many, and each one's start, wall time and outcome."""
    parts = []
    for item in invocations:
        start = f"{item['started']}, " if item.get("started") else ""
        outcome = f", {item['outcome']}" if item.get("outcome") else ""
        parts.append(f"{start}{item.get('wall_seconds', '?')} s{outcome}")
    return f"{len(invocations)} ({'; '.join(parts)})"


def size_lines(entries: object) -> list[str]:
    """``meta["size"]`` (``bhyt_pl.study.protocol.size``) as ``- parameters: ...``, one line per model shape (``at L
    layers`` added when there are several)."""
    if not isinstance(entries, list) or not entries:
        return []
    sizes = [RunSize.from_dict(entry) for entry in entries]
    if len(sizes) == 1:
        return [f"- parameters: {sizes[0].text()}"]
    return [f"- parameters at {size.n_layers} layers: {size.text()}" for size in sizes]


def meta_lines(meta: Mapping[str, object], skip: Sequence[str]) -> list[str]:
    """One ``- key: value`` line per entry of ``meta`` but ``skip`` and the partial marker (``partial_lines``);
    ``wall_seconds`` is the total over the ``invocations`` listed after it; the runs' ``size`` in words
    (``size_lines``: a record from before it was kept has none)."""
    lines = []
    for key, value in meta.items():
        if key in skip or key == "partial":
            continue
        if key == "size":
            lines += size_lines(value)
            continue
        text = invocations_text(value) if key == "invocations" and isinstance(value, list) else value
        lines.append(f"- {key.replace('_', ' ')}: {text}")
    return lines


def failed_runs_lines(results: Sequence[RunResult]) -> list[str]:
    """A section naming every run that failed with an error (its tries spent, on a cluster), with the error's first
    line: nothing when none did. Diverged runs are results, not failures, and are shown in the tables."""
    failed = [r for r in results if r.status == RunStatus.ERROR]
    if not failed:
        return []
    rows = [[f"`{r.spec.label}`", (r.error or "no error recorded").strip().splitlines()[-1][:300]] for r in failed]
    return [
        f"## Failed runs ({len(failed)} of {len(results)})",
        "",
        "These runs ended with an error and no result; every table leaves them out. Running the same command again "
        "retrains them (finished runs are reused).",
        "",
        markdown_table(["run", "error"], rows),
        "",
    ]


def write_report(out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
    """``report.md`` and (``figures``) the PNGs under ``out``, from ``record`` alone; their paths by name
    (``report`` and one per figure). Nothing else is written: the record is saved by ``bhyt_pl.study.record``."""
    out.mkdir(parents=True, exist_ok=True)
    meta, design, sweep = record.meta, record.design, record.sweep
    runs = StudyRuns(record.runs) if design is not None else None
    paths = {"report": out / "report.md"}
    items: list[ClaimResult] = []
    skipped: list[ClaimSpec] = []
    roles = meta.get("roles", {})
    if design is not None:
        items, skipped = evaluate(runs, design, roles, tokens_per_step=int(meta.get("tokens_per_step", 0)))
    max_loss = float(meta["max_loss"])
    title = (
        f"{meta['preset']} ({meta['n_layers_label']} layers), {meta['steps']} steps of {meta['tokens_per_step']} tokens"
    )
    lines = [f"# {'Stability sweep' if sweep else 'Depth study'}", "", *partial_lines(meta)]
    lines += [f"Command: `{meta['command']}`", ""]
    lines += meta_lines(meta, skip=("command", "machine", "n_layers_label", "overrides", "roles"))
    lines.append(f"- layers: {meta['n_layers_label']}; config overrides: {meta.get('overrides') or 'none'}")
    lines.append("- machine: " + ", ".join(f"{k} {v}" for k, v in meta["machine"].items()))
    lines.append("")
    lines += failed_runs_lines(record.runs)
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
        at_depth_lr = [FigureGroup(g.label, depth_runs(runs, design, g.label)) for g in design.groups]
        at_best_lr = [FigureGroup(g.label, design.evaluation_runs(runs, g.label)) for g in design.groups]
        depth_title = f"{title}; {depth_runs_words(design)}"
        paths["depth_final"] = save_figure(
            depth_profile_figure(at_depth_lr, f"end of training: {depth_title}"), out / "depth_final.png"
        )
        paths["trajectories"] = save_figure(trajectory_figure(at_depth_lr, depth_title), out / "trajectories.png")
        paths["lr"] = save_figure(lr_figure(runs, design, max_loss), out / "lr_sensitivity.png")
        paths["importance"] = save_figure(importance_figure(at_best_lr), out / "layer_importance.png")
        paths["loss"] = save_figure(loss_figure(at_best_lr, title), out / "loss.png")
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
        "Holm step-down p-values over every (claim, rate) test of the family (family-wise error 5%). The "
        "difference column quotes the interval the rule decides by: 95%, 90% for a ~ (TOST) row.",
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
        "### At initialisation, at the end, made by training",
        "",
        PHASES_DESCRIPTION + " Depth claims only: the loss claims' step 0 is the untrained model's loss, which no "
        "claim is about.",
        "",
        PHASES_READINGS,
        "",
        phases_note((c.spec.phase for c, _ in depth_tests(items)), "claim"),
        "",
        phases_table(items),
        "",
        "### Every test",
        "",
        detail_table(items),
        "",
        "Plug-in seeds: how many seeds would make this test's deciding interval exclude its bound if the mean and "
        "the SD stayed as measured, for this test alone at its own level. With the measured mean just reaching "
        "the bound, that is about 50 % power, and it ignores the Holm adjustment beside it; the confirmation's "
        "power plan (`python -m bhyt_pl study confirm`, docs/method.md, section 10) gives counts at 80 % power "
        "for a family.",
        "",
        "## Claims over training",
        "",
        "Every test again at each trajectory point (validation loss and depth statistics on the same fixed "
        "batches): one letter per point, R reproduced, N not reproduced, . inconclusive (step 0 is the "
        "initialisation); intervals 95%, 90% for a ~ (TOST) row. Made by training: the end's difference minus step "
        "0's, paired per seed, with its 95% interval (the phases above). These verdicts are uncorrected and "
        "descriptive: they are not adjusted for the number of points or tests, they show how an effect evolves, and "
        "no claim is decided by them.",
        "",
        training_table(items),
        "",
        "![claims over training](claims_over_training.png)",
        "",
        "## Depth-wise growth",
        "",
        "Per run: ln(value at layer L / value at layer L/4) and the least-squares slope of ln value per layer over "
        "layers L/4..L, mean [95% CI] (min-max) over the evaluation seeds. Reads: *grows* / *shrinks* when the 95% "
        "interval of the ln magnitude ratio excludes 0, *flat* when its 90% interval lies within "
        f"+-{growth_margin():g}.",
        "",
        growth_table(growth),
        "",
        *growth_prose(growth),
        "",
        "## Schemes at matched rates",
        "",
        "Last layer: the last block's output on the fixed validation batches in eval mode at the end; mean-token "
        "magnitude: mean over tokens of ||y_t||; median token: median over tokens (position 0 excluded); per "
        "coordinate: the mean-token magnitude / sqrt(d), the scale to set beside a wider model's numbers. "
        "Magnitudes and variances: geometric mean over the evaluation seeds [95% CI back-transformed from the ln "
        "scale the claims test] (min-max), so no interval goes below 0; growth: mean of the per-seed ln ratios.",
        "",
        matched_table(runs, design),
        "",
        "## Schemes at their best learning rate",
        "",
        "mean [95% t-interval] (min-max) over evaluation seeds, magnitudes and variances as geometric means "
        "(interval back-transformed from the ln scale); diverged runs are left out of the means. "
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
        "the geometric mean of the per-seed ratios, at each matched rate.",
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

"""The confirmation's report: ``report.md`` and its figures from a ``StudyRecord`` (``results.json``) alone, so
``python -m bhyt_pl study confirm --report-from DIR`` rebuilds them without the pilot or the run folders.

The document: the family's verdicts (one-sided tests on the confirmation's seeds, Holm across the family), each
test at step 0, at the end and made by training (``bhyt_pl.study.report.phases``), the paper-level claims
(intersection-union tests), the frozen plan, the exploratory rows with their reasons and seed counts, the groups at
the matched rate, and every test over training (uncorrected and descriptive). Tables sit on the test's scale: a test
on ln ratios shows the geometric mean of the per-seed ratios with its interval back-transformed from the ln scale,
and a group's magnitude or variance is a geometric mean (``columns``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.claims import CONFIRMATION_ROWS, ClaimSpec
from bhyt_pl.study.protocol.confirmation import ClaimVerdict, Evaluation, FamilyResult, evaluate, family_runs
from bhyt_pl.study.protocol.metrics import metric
from bhyt_pl.study.protocol.power_plan import Plan, PlannedClaim, PlannedTest
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.report.columns import SeedRuns, matched_columns
from bhyt_pl.study.report.exploration import meta_lines, partial_lines
from bhyt_pl.study.report.figures import FigureGroup, depth_profile_figure, save_figure, trajectory_figure
from bhyt_pl.study.report.markdown import Column, num, signed_ci, table
from bhyt_pl.study.report.phases import DESCRIPTION as PHASES_DESCRIPTION
from bhyt_pl.study.report.phases import READINGS as PHASES_READINGS
from bhyt_pl.study.report.phases import phase_columns, phases_note

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "claims_table",
    "declared_family_table",
    "declared_rows_table",
    "estimate",
    "exploratory_table",
    "family_figure",
    "family_table",
    "groups_table",
    "phases_table",
    "plan_table",
    "training_table",
    "write_report",
]


def estimate(t: FamilyResult) -> str:
    """The test's number on its own scale: the geometric mean of the per-seed ratios ``x r [low, high] (ln m)``
    with its 95 % interval back-transformed from the ln scale, or the mean difference ``m [low, high]``."""
    ratio = t.ratio()
    if ratio is not None:
        if ratio.n == 0:
            return "n/a"
        if not ratio.defined:
            return f"x{num(ratio.mean)} (n={ratio.n})"
        return f"x{num(ratio.mean)} [{num(ratio.low)}, {num(ratio.high)}] (ln {num(t.difference.mean)})"
    d = t.difference
    if d.n == 0:
        return "n/a"
    return f"{num(d.mean)} [{num(d.low)}, {num(d.high)}]" if d.defined else f"{num(d.mean)} (n={d.n})"


def _bound(t: FamilyResult) -> str:
    """The one-sided 95 % bound on the test's scale (a ratio bound for an ln ratio): ``< x0.3``, ``> 0.1``."""
    bound = t.one_sided_bound
    if not math.isfinite(bound):
        return "-"
    side = "<" if t.planned.rule in ("lower", "no_worse") else ">"
    return f"{side} x{num(math.exp(bound))}" if t.log else f"{side} {num(bound)}"


def family_table(evaluation: Evaluation) -> str:
    """One row per primary test: the statistic, the pairs, the estimate with its 95 % interval and one-sided 95 %
    bound, the one-sided p-value, Holm's adjusted p-value and the verdict."""
    columns: list[Column[tuple[int, FamilyResult]]] = [
        Column("#", lambda row: str(row[0])),
        Column("test (one-sided)", lambda row: row[1].planned.name),
        Column("scale", lambda row: "ratio (ln ratio tested)" if row[1].log else "difference"),
        Column("pairs", lambda row: str(row[1].difference.n)),
        Column("estimate [95 % CI]", lambda row: estimate(row[1])),
        Column("one-sided 95 % bound", lambda row: _bound(row[1])),
        Column("one-sided p", lambda row: num(row[1].p)),
        Column("Holm p", lambda row: num(row[1].holm_p)),
        Column("verdict", lambda row: f"**{row[1].verdict}**"),
    ]
    return table(columns, list(enumerate(evaluation.tests, start=1)), empty="(no test is in the family)")


def phases_table(evaluation: Evaluation) -> str:
    """Every primary test at each phase (``bhyt_pl.study.report.phases``), numbered as in ``family_table``: step 0,
    the end and made by training, on the test's scale, and where the end effect comes from. Depth tests only: the
    loss's step 0 is the untrained model's."""
    columns: list[Column[tuple[int, FamilyResult]]] = [
        Column("#", lambda row: str(row[0])),
        Column("test", lambda row: row[1].planned.name),
        Column("d", lambda row: _scale(row[1].planned.statistic)),
        Column("pairs", lambda row: str(row[1].difference.n)),
        *phase_columns(lambda row: row[1].phases),
    ]
    rows = [
        (i, t) for i, t in enumerate(evaluation.tests, start=1) if metric(t.planned.statistic).statistic is not None
    ]
    return table(columns, rows, empty="(no depth test is in the family)")


def claims_table(evaluation: Evaluation, plan: Plan) -> str:
    """Every paper-level claim: its components, the plan's seeds and joint power, the intersection-union p-value
    (the largest component's Holm p) and verdict when primary, else why it stays exploratory."""

    def verdict(row: ClaimVerdict) -> str:
        if row.iut is None:
            return f"exploratory: {row.planned.reason}"
        failing = f" (not below {plan.alpha:g}: {'; '.join(row.iut.failing)})" if row.iut.failing else ""
        missing = f" (untested: {'; '.join(row.iut.missing)})" if row.iut.missing else ""
        return f"**{row.verdict}**{failing}{missing}"

    columns: list[Column[ClaimVerdict]] = [
        Column("claim", lambda row: row.planned.name),
        Column("components", lambda row: "; ".join(row.planned.components)),
        Column("planned seeds (joint power)", lambda row: _claim_plan(row.planned)),
        Column("p (largest Holm p)", lambda row: num(row.iut.p) if row.iut is not None else "-"),
        Column("verdict", verdict),
    ]
    return table(columns, evaluation.claims, empty="(no paper-level claim)")


def _claim_plan(c: PlannedClaim) -> str:
    if c.seeds is None:
        return "-"
    return f"{c.seeds}" + (f" ({num(c.joint_power)})" if math.isfinite(c.joint_power) else "")


def _pilot(t: PlannedTest) -> str:
    if t.pilot_n < 2:
        return f"{num(t.pilot_mean)} (n={t.pilot_n})" if t.pilot_n else "n/a"
    return f"{t.pilot_mean:+.3f} [{t.pilot_low:+.3f}, {t.pilot_high:+.3f}]"


def plan_table(plan: Plan) -> str:
    """The frozen plan's primary rows: the pilot's mean with its 80 % interval, the shrunk effect and inflated SD
    the plan assumed, the level, the seeds for power 0.8, the pairs it gets and its power there."""
    columns: list[Column[PlannedTest]] = [
        Column("test", lambda t: t.name),
        Column("pilot n", lambda t: str(t.pilot_n)),
        Column("pilot mean [80 %]", _pilot),
        Column("shrunk effect", lambda t: f"{t.effect:+.3f}"),
        Column("inflated SD", lambda t: f"{t.sd:.3f}"),
        Column("level", lambda t: f"{t.level:.3g}"),
        Column("seeds (power 0.8)", lambda t: str(t.seeds)),
        Column("pairs", lambda t: str(t.pairs)),
        Column("power at the pairs", lambda t: num(t.power)),
        Column("why it is in", lambda t: t.why),
    ]
    return table(columns, plan.primary, empty="(no test is in the family)")


def _scale(name: str) -> str:
    """What ``d`` is for a statistic: an ln ratio of two runs' values, or a difference of two ln growth ratios."""
    return "ln ratio" if metric(name).log else "difference (each an ln ratio of layers)"


def declared_family_table(plan: Plan) -> str:
    """The family a plan admits, as docs/method.md declares it before the confirmation's runs: each primary test
    with its statistic, the pilot's mean and 80 % interval, its seed count and why it is in."""
    columns: list[Column[tuple[int, PlannedTest]]] = [
        Column("#", lambda row: str(row[0])),
        Column("test (one-sided, at the matched rate)", lambda row: row[1].name),
        Column("d", lambda row: _scale(row[1].statistic)),
        Column("pilot mean [80 %]", lambda row: _pilot(row[1])),
        Column("seeds", lambda row: str(row[1].seeds)),
        Column("why it is in", lambda row: row[1].why),
    ]
    return table(columns, list(enumerate(plan.primary, start=1)), empty="(no test is in the family)")


def declared_rows_table(rows: Sequence[ClaimSpec] = CONFIRMATION_ROWS) -> str:
    """The claims table as the confirmation reads it, one line per declaration: the rows proposed for the primary
    family (the plan admits them unless the pilot makes them infeasible or too costly) by their reason, then the
    rows declared exploratory by theirs."""
    declared: dict[tuple[bool, str], list[str]] = {}
    for row in rows:
        declared.setdefault((row.primary, row.why), []).append(row.name)
    ordered = sorted(declared.items(), key=lambda item: not item[0][0])  # primary first, else in table order
    columns: list[Column[tuple[tuple[bool, str], list[str]]]] = [
        Column("declared", lambda item: "primary candidate" if item[0][0] else "exploratory"),
        Column("why", lambda item: item[0][1]),
        Column("rows", lambda item: "; ".join(item[1])),
    ]
    return table(columns, ordered)


def exploratory_table(plan: Plan) -> str:
    """Every row outside the family: its status and reason, the pilot's mean [80 %], the seeds it would need at
    80 % power under the plan's rule at the level it would have (none: infeasible) and the plug-in count."""
    columns: list[Column[PlannedTest]] = [
        Column("test", lambda t: t.name),
        Column("rule", lambda t: t.rule + (f" {t.margin:g}" if t.rule in ("no_worse", "equivalent") else "")),
        Column("rate", lambda t: f"{t.rate:g}" if t.rate is not None else "best"),
        Column("status", lambda t: t.status),
        Column("reason", lambda t: t.reason),
        Column("pilot mean [80 %]", _pilot),
        Column("seeds at 80 % power (level)", lambda t: f"{t.seeds if t.seeds else '-'} ({t.level:.3g})"),
        Column("plug-in seeds", lambda t: str(t.plug_in_seeds) if t.plug_in_seeds else "-"),
    ]
    return table(columns, [t for t in plan.tests if not t.primary], empty="(none)")


def _group_runs(record: StudyRecord) -> dict[str, list[RunResult]]:
    """Each planned group's confirmation runs, by seed index (``family_runs``: never a pilot seed)."""
    return {
        g: [r for _, r in sorted(family_runs(record.plan, record.runs, g).items())] for g in record.plan.group_seeds
    }


def groups_table(record: StudyRecord) -> str:
    """Every planned group at the confirmation's rate: validation loss and each claimable summary, magnitudes and
    variances as geometric means over the confirmation's seeds (``columns.matched_columns``)."""
    rate = float(record.plan.source["rate"])
    rows = [SeedRuns(group, rate, runs) for group, runs in _group_runs(record).items() if runs]
    return table(matched_columns(), rows, empty="(no confirmation run yet)")


_MARK = {True: "+", False: "."}


def _letters(t: FamilyResult, alpha: float) -> str:
    return "".join(_MARK[p["p_one_sided"] < alpha] if math.isfinite(p["p_one_sided"]) else "?" for p in t.over_training)


def _point(t: FamilyResult, p: Mapping[str, float]) -> str:
    if not math.isfinite(p["mean"]):
        return "n/a"
    if t.log:
        return f"x{num(math.exp(p['mean']))} (ln {num(p['mean'])}) @{p['tokens']:,}"
    return f"{num(p['mean'])} @{p['tokens']:,}"


def training_table(evaluation: Evaluation, alpha: float) -> str:
    """Every primary test at each trajectory point: ``+`` where its one-sided p-value is below ``alpha`` at that
    point alone, ``.`` where not (uncorrected: a description of how the effect evolves, not a verdict), with the
    difference at step 0, the first trained point and the last point, and the one training made (end minus step 0,
    paired per seed, 95 %)."""
    columns: list[Column[FamilyResult]] = [
        Column("test", lambda t: t.planned.name),
        Column("p < 0.05 at each point, uncorrected (step 0 first)", lambda t: f"`{_letters(t, alpha)}`"),
        Column("step 0", lambda t: _point(t, t.over_training[0])),
        Column("first trained point", lambda t: _point(t, t.over_training[min(1, len(t.over_training) - 1)])),
        Column("last point", lambda t: _point(t, t.over_training[-1])),
        Column(
            "made by training (end - step 0, 95 %)",
            lambda t: signed_ci(t.phases.training) if t.phases is not None else "-",
        ),
    ]
    return table(columns, [t for t in evaluation.tests if t.over_training], empty="(no trajectory)")


def family_figure(evaluation: Evaluation) -> Figure:
    """Each primary test's mean difference on its scale (ln ratio or difference) with its 95 % interval against
    training tokens, one panel per test; the dashed line is 0."""
    from matplotlib.figure import Figure

    panels = [t for t in evaluation.tests if t.over_training]
    columns = min(4, max(1, len(panels)))
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(4 * columns, 2.8 * rows + 0.5), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, t in zip(axes, panels, strict=False):
        points = [p for p in t.over_training if math.isfinite(p["mean"])]
        x = [max(p["tokens"], 1) for p in points]
        (line,) = ax.plot(x, [p["mean"] for p in points], marker="o", markersize=2)
        low = [p["low"] if math.isfinite(p["low"]) else p["mean"] for p in points]
        high = [p["high"] if math.isfinite(p["high"]) else p["mean"] for p in points]
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.axhline(0, color="black", linestyle="--", linewidth=0.8)
        positive = [p["tokens"] for p in points if p["tokens"] > 0]
        ax.set_xscale("symlog", linthresh=max(1, min(positive, default=1)))
        ax.set_title(t.planned.name + (" (ln ratio)" if t.log else ""), fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    figure.supxlabel("training tokens")
    figure.suptitle(
        "the family over training: target - baseline, mean and 95% CI over the confirmation's seeds "
        "(uncorrected, descriptive)",
        fontsize=10,
    )
    return figure


def _meta_lines(record: StudyRecord) -> list[str]:
    lines = meta_lines(record.meta, skip=("command", "machine", "kind"))
    machine = record.meta.get("machine", {})
    if machine:
        lines.append("- machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    return lines


def _seed_words(plan: Plan) -> str:
    if not plan.group_seeds:
        return "no group trains"
    last = plan.first_seed_index + max(plan.group_seeds.values()) - 1
    used = plan.pilot_seed_indices
    return (
        f"seed indices {plan.first_seed_index}..{last}, above every index the pilot used "
        f"({min(used)}..{max(used)}); per group: " + ", ".join(f"{g} {n}" for g, n in plan.group_seeds.items())
    )


def write_report(out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
    """``report.md`` and (``figures``, once there are runs) the PNGs under ``out``, from ``record`` alone; their
    paths by name (``report`` and one per figure). Nothing else is written: the record is saved by
    ``bhyt_pl.study.record``."""
    out.mkdir(parents=True, exist_ok=True)
    plan, meta = record.plan, record.meta
    evaluation = evaluate(record.plan, record.runs, int(record.meta.get("tokens_per_step") or 0))
    paths = {"report": out / "report.md"}
    has_runs = any(t.difference.n for t in evaluation.tests)
    if figures and has_runs:
        paths["family"] = save_figure(family_figure(evaluation), out / "family_over_training.png")
        groups = [FigureGroup(g, runs) for g, runs in _group_runs(record).items() if runs]
        title = (
            f"{meta.get('preset')} ({meta.get('n_layers_label')} layers), {meta.get('steps')} steps; "
            f"every scheme at lr {float(plan.source['rate']):g} (matched)"
        )
        paths["depth_final"] = save_figure(
            depth_profile_figure(groups, f"end of training: {title}"), out / "depth_final.png"
        )
        paths["trajectories"] = save_figure(trajectory_figure(groups, title), out / "trajectories.png")
    confirmed = sum(t.verdict == stats.CONFIRMED for t in evaluation.tests)
    lines = [
        "# Depth study: confirmation",
        "",
        *partial_lines(meta, "confirmation"),
        f"Command: `{meta.get('command', '?')}`",
        "",
        *_meta_lines(record),
        "",
        "The pilot (the exploration) chose each group's candidate and rates; this confirmation keeps those choices, "
        f"trains only the groups its primary family needs, at the pilot's matched rate {meta.get('rate', '?')}, on "
        f"new seeds ({_seed_words(plan)}), and its verdicts read only those seeds (docs/method.md, section 10, "
        '"Confirmation").',
        "",
        "## The primary family",
        "",
        f"One-sided paired t-tests of d = target - baseline, each in the direction the paper claims, declared before "
        f"these runs; Holm's step-down adjustment across the {plan.family_size} tests (family-wise error "
        f"{plan.alpha:g}): a test is *confirmed* when its Holm-adjusted p-value is below {plan.alpha:g}, *not "
        "confirmed* otherwise (a difference on the other side is never a finding), *untested* without 2 pairs. "
        "Ratio: the geometric mean of the per-seed ratios target / baseline with its 95 % interval back-transformed "
        "from the ln scale the test uses (the ln mean in brackets); difference: the mean of the per-seed "
        "differences (growth statistics are already ln ratios). The one-sided 95 % bound is the interval the "
        "one-sided test at 0.05 reads.",
        "",
        family_table(evaluation),
        "",
        f"- {confirmed} of {len(evaluation.tests)} primary tests confirmed after Holm's adjustment.",
        "",
        "### At initialisation, at the end, made by training",
        "",
        PHASES_DESCRIPTION + " Numbered as the tests above; the depth tests only (the loss's step 0 is the "
        "untrained model's).",
        "",
        PHASES_READINGS,
        "",
        phases_note((t.planned.phase for t in evaluation.tests), "test"),
        "",
        phases_table(evaluation),
        "",
        "## Paper-level claims (intersection-union tests)",
        "",
        'A claim such as "BHyT has the lowest X" holds only if BHyT is below every baseline: its p-value is the '
        "largest of its components' Holm-adjusted p-values, and it is confirmed only if every component is. A claim "
        "with a component outside the family stays exploratory, naming that component and why.",
        "",
        claims_table(evaluation, plan),
        "",
        "## The frozen plan",
        "",
        f"Written to plan.json before the first run and never recomputed: the effect shrunk to the pilot's "
        f"{plan.shrink_confidence:.0%} interval bound nearer zero, the SD inflated to its one-sided "
        f"{plan.sd_confidence:.0%} upper bound, seeds for power {plan.power:g} of the one-sided test at "
        f"alpha / {max(plan.family_size, 1)} = {plan.level:.3g}, {plan.min_seeds} to {plan.max_seeds} seeds a test"
        + (f"; --seeds {plan.seeds_override} replaced the counts" if plan.seeds_override else "")
        + f". Seeds: {_seed_words(plan)}; {plan.runs} runs.",
        "",
        plan_table(plan),
        "",
        "## Exploratory",
        "",
        "Rows outside the family, each with its reason: declared before the runs (DyT's rows, the mean token, the "
        "loss claims at each group's best rate, equivalences), outside a condition on the pilot's runs, infeasible "
        "(the pilot's 80 % interval reaches zero) or dropped by the plan (more seeds than --max-seeds). Seeds at "
        "80 % power: the plan's rule at the level the row would have in the family (for a dropped row, the level "
        "it had when it left); plug-in: the pilot's mean and SD taken as true, optimistic, shown for scale only.",
        "",
        exploratory_table(plan),
        "",
    ]
    not_tested = plan.source.get("not_tested", [])
    if not_tested:
        lines += [f"Not tested (a role without a group in the pilot): {'; '.join(not_tested)}.", ""]
    lines += [
        "## Groups at the confirmation's rate",
        "",
        "Over the confirmation's seeds: validation loss as mean [95 % CI] (min-max); magnitudes and variances as "
        "geometric means with their 95 % intervals back-transformed from the ln scale (min-max); growth as the mean "
        "of the per-seed ln ratios.",
        "",
        groups_table(record),
        "",
        "## Over training (uncorrected, descriptive)",
        "",
        "Each primary test again at every trajectory point, on the seeds with that point: `+` where its one-sided "
        f"p-value is below {plan.alpha:g} at that point alone, `.` where not. Made by training: the end's difference "
        "minus step 0's, paired per seed, with its 95 % interval (the phases above). These points are not adjusted "
        "for their number or the family's: they show how each effect evolves, and no claim is decided by them.",
        "",
        training_table(evaluation, plan.alpha),
        "",
    ]
    if has_runs:
        lines += [
            "![the family over training](family_over_training.png)",
            "",
            "![depth profile at the end](depth_final.png)",
            "",
            "![trajectories](trajectories.png)",
            "",
        ]
    paths["report"].write_text("\n".join(lines))
    return paths

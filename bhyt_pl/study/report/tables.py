"""The exploration's tables, each a list of ``Column`` entries over its rows (``bhyt_pl.study.report.markdown``):
the design, the schemes at their best and at the matched rates (per-scheme columns from
``bhyt_pl.study.report.columns``), learning-rate sensitivity, layer importance, site B's approximation, depth-wise
growth, the claims (evaluated in ``bhyt_pl.study.protocol.claims``; their phases through
``bhyt_pl.study.report.phases``) and the stability sweep.

Seed aggregation and verdicts come from ``bhyt_pl.study.protocol.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bhyt_pl.callbacks.layer_metrics import split_layer_key
from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.claims import ClaimResult, Test
from bhyt_pl.study.protocol.design import RunKey, StudyDesign, StudyRuns, rate_key
from bhyt_pl.study.protocol.metrics import metric, value
from bhyt_pl.study.protocol.plan import SELECTION_SEED
from bhyt_pl.study.protocol.spec import RunResult, RunStatus
from bhyt_pl.study.report.columns import (
    SeedRuns,
    diverged_cell,
    finite_mean,
    matched_columns,
    per_seed,
    run_value,
    seed_column,
    statistic_columns,
)
from bhyt_pl.study.report.markdown import Column, ci, markdown_table, num, short_ci, signed_ci, table
from bhyt_pl.study.report.phases import phase_columns

__all__ = [
    "BOUND_COLUMNS",
    "GROWTH_COLUMNS",
    "GROWTH_METRICS",
    "GrowthRow",
    "approximation_table",
    "bound_table",
    "claim_name",
    "deciding_interval",
    "depth_tests",
    "design_table",
    "detail_table",
    "flag",
    "group_columns",
    "group_table",
    "growth_margin",
    "growth_rows",
    "growth_table",
    "growth_words",
    "importance_table",
    "lr_table",
    "matched_table",
    "phases_table",
    "summary_table",
    "sweep_table",
    "training_table",
]


# ----------------------------------------------------------------------------- per-scheme tables
def flag(design: StudyDesign, group: str) -> str:
    """The group's label, flagged when its best rate is still at an edge of the rates it tried."""
    s = design.selections.get(group)
    return f"{group} (edge: {s.edge})" if s is not None and s.edge else group


def _seeds_ok(row: SeedRuns) -> str:
    ok = row.ok
    failed = [r for r in row.runs if r.status != RunStatus.OK]
    return f"{len(ok)}/{len(row.runs)}" + (" (" + ", ".join(diverged_cell(r) for r in failed) + ")" if failed else "")


def _spikes(row: SeedRuns) -> str:
    loss = finite_mean(run_value(r, "loss_spikes") for r in row.ok)
    return f"{num(loss)} / {num(finite_mean(run_value(r, 'grad_norm_spikes') for r in row.ok))}"


def _max_grad_layers(row: SeedRuns) -> str:
    layers = (run_value(r, "max_grad_layer") for r in row.runs)
    return ", ".join(str(int(v)) if math.isfinite(v) else "-" for v in layers)


def group_columns() -> list[Column[SeedRuns]]:
    """The per-scheme table at each group's best rate: losses, every statistic summary with a header, and
    StabilityMonitor's columns (spikes, layer of max grad norm, last-layer attention entropy)."""
    return [
        Column("scheme", lambda row: row.label),
        Column("candidate", lambda row: row.runs[0].spec.candidate),
        Column("lr", lambda row: f"{row.lr:g}"),
        Column("seeds ok", _seeds_ok),
        seed_column("val loss", "val_loss", 4),
        seed_column("train loss", "train_loss", 4),
        *statistic_columns("last layer"),
        *statistic_columns("growth"),
        Column("loss / grad-norm spikes", _spikes),
        Column("layer of max grad norm", _max_grad_layers),
        seed_column("last-layer attn entropy", "last_attn_entropy"),
        *statistic_columns("over layers"),
    ]


def group_table(runs: StudyRuns, design: StudyDesign) -> str:
    """One row per scheme group over its evaluation seeds at its best rate (``group_columns``); a group without
    them yet gets a placeholder row."""
    columns = group_columns()
    rows = []
    for g in design.groups:
        seeds = design.evaluation_runs(runs, g.label)
        if seeds:
            rows.append([c.cell(SeedRuns(flag(design, g.label), seeds[0].spec.lr, seeds)) for c in columns])
        else:
            rows.append([flag(design, g.label), "selection unfinished"] + ["-"] * (len(columns) - 2))
    return markdown_table([c.header for c in columns], rows)


def matched_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Every group's kept candidate at every matched rate (evaluation seeds): the numbers the depth claims use."""
    rows = [
        SeedRuns(g.label, lr, design.evaluation_runs(runs, g.label, lr))
        for lr in design.matched_lrs
        for g in design.groups
        if design.kept(g.label) is not None
    ]
    return table(matched_columns(), rows, empty="(no matched rate: see the design section)")


# ----------------------------------------------------------------------------- the design
def design_table(design: StudyDesign) -> str:
    """Each group's selection: its budget (candidates x rates + extensions), the kept candidate and rate, the
    rates added past the grid, and the edge flag."""
    rows = []
    for g in design.groups:
        s = design.selections.get(g.label)
        if s is None:
            rows.append([g.label, str(len(g.candidates)), "-", "-", "-", "-", "selection unfinished"])
            continue
        failed = "none trained: " + "; ".join(f"{r.spec.label} {diverged_cell(r)}" for r in s.runs)
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
    return markdown_table(header, rows)


def lr_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Validation loss of every selection run (selection seed): candidates (rows) x learning rates (grid and
    extensions); the kept cell in bold; diverged runs give the step of divergence."""
    rates = {rate_key(r.spec.lr): r.spec.lr for r in runs if r.spec.seed_index == SELECTION_SEED}
    lrs = sorted(rates.values())

    def cell(group: str, candidate: str, lr: float) -> str:
        r = runs.get(RunKey(group, candidate, rate_key(lr), SELECTION_SEED))
        if r is None:
            return "-"
        if r.status == RunStatus.DIVERGED:
            return f"diverged @{r.diverged_step}"
        if r.status == RunStatus.ERROR:
            return "error"
        s = design.kept(group)
        text = num(r.val_loss, 4)
        return f"**{text}**" if s is not None and s.chosen.spec.label == r.spec.label else text

    columns: list[Column[tuple[str, str]]] = [
        Column("scheme", lambda row: flag(design, row[0])),
        Column("candidate", lambda row: row[1]),
    ]
    columns += [Column(f"lr {lr:g}", lambda row, lr=lr: cell(row[0], row[1], lr)) for lr in lrs]
    return table(columns, [(g.label, v.label) for g in design.groups for v in g.candidates])


# ----------------------------------------------------------------------------- layer importance
def importance_table(runs: StudyRuns, design: StudyDesign) -> str:
    """Layer importance: validation-loss increase when one block is skipped, mean over seeds, summarised by
    depth quarter, with the number of blocks whose removal costs less than 0.01 nats."""
    rows = []
    for g in design.groups:
        seeds = [r for r in design.evaluation_runs(runs, g.label) if r.status == RunStatus.OK and r.importance]
        if not seeds:
            continue
        n = min(len(r.importance) for r in seeds)
        mean = [finite_mean(r.importance[i] for r in seeds) for i in range(n)]
        q = max(1, n // 4)
        quarters = [mean[i * q : (i + 1) * q] if i < 3 else mean[3 * q :] for i in range(4)]
        rows.append(
            [flag(design, g.label), str(len(seeds))]
            + [num(finite_mean(part)) for part in quarters]
            + [str(int(max(range(n), key=lambda i: mean[i])) + 1), f"{sum(v < 0.01 for v in mean)}/{n}"]
        )
    header = ["scheme", "seeds", "mean dloss, first quarter", "second", "third", "last quarter"]
    header += ["most important layer", "blocks < 0.01 nats"]
    return markdown_table(header, rows) if rows else "(layer importance not measured)"


# ----------------------------------------------------------------------------- approximated statistics
def approximation_table(runs: StudyRuns, design: StudyDesign, reference: str | None) -> str:
    """Where an approximated site-B statistic parts from the exact one: for every group whose runs record
    ``bhyt_moment_ratio`` (approximated over exact second moment, 1 = exact) or that is the ``reference`` group
    (the role ``BHyT*``), the ratio in the first 4 layers and the rest, over positions 0-7 and later (at the
    group's best rate), and the last-layer magnitude and variance as a ratio to the reference's (seed-paired, exp
    of the mean ln ratio) at each matched rate: depth statistics move with the learning rate, so, as in the
    depth claims, both sides are read at the same rate."""

    def has_ratio(seeds: Sequence[RunResult]) -> bool:
        return any(k.startswith("bhyt_moment_ratio/") for r in seeds for k in r.depth_final)

    family = [g for g in design.groups if g.label == reference or has_ratio(design.evaluation_runs(runs, g.label))]
    if not family:
        return "(no group with an approximated statistic)"
    lrs = design.matched_lrs if reference else ()
    rows = []
    for g in family:
        ok = [r for r in design.evaluation_runs(runs, g.label) if r.status == RunStatus.OK]
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
                per_run.append(finite_mean(v for i, v in layers.items() if i >= lo and (hi is None or i < hi)))
            return num(finite_mean(per_run))

        cells = [flag(design, g.label), ratio("bhyt_moment_ratio", 0, 4), ratio("bhyt_moment_ratio", 4, None)]
        cells += [ratio("bhyt_moment_ratio_first8", 0, None), ratio("bhyt_moment_ratio_rest", 0, None)]
        for stat in ("magnitude", "variance"):
            ratios = []
            if g.label != reference:  # the reference's ratio to itself says nothing
                ratios = [_matched_ratio(runs, design, g.label, reference, lr, stat) for lr in lrs]
            cells.append("; ".join(r for r in ratios if r) or "-")
        rows.append(cells)
    header = ["scheme", "moment ratio, layers 1-4", "layers 5-L", "positions 0-7", "positions 8+"]
    header += [
        f"last-layer {stat} / {reference}'s, rate: geometric-mean ratio [95% CI]" for stat in ("magnitude", "variance")
    ]
    return markdown_table(header, rows)


def _matched_ratio(runs: StudyRuns, design: StudyDesign, group: str, reference: str, lr: float, stat: str) -> str:
    """``lr: ratio [low, high]``: the geometric mean of the per-seed ratios group / reference at one matched rate,
    its 95 % interval back-transformed from the ln scale."""
    sides = [
        {r.spec.seed_index: value(r, stat) for r in design.evaluation_runs(runs, label, lr) if r.status == RunStatus.OK}
        for label in (group, reference)
    ]
    if not sides[0] or not sides[1]:
        return ""
    g = stats.geometric_mean_ratio(stats.paired_differences(*sides))
    return f"{lr:g}: {num(g.mean)} [{num(g.low)}, {num(g.high)}]"


# ----------------------------------------------------------------------------- depth-wise growth
GROWTH_METRICS = ("magnitude_growth", "magnitude_growth_slope", "variance_growth", "variance_growth_slope")
"""The growth table's metrics: the abstract's claim is about the magnitude's and the variance's growth."""


def growth_margin() -> float:
    """A profile whose ln magnitude growth from layer L/4 to L lies within +-this (90 % interval, TOST) reads
    "flat": the magnitude growth's claim margin."""
    return metric("magnitude_growth").margin


def growth_words(iv: stats.Interval, margin: float | None = None) -> str:
    """Words that follow the numbers: "grows" (95 % interval above 0), "shrinks" (below 0), "flat" (90 %
    interval within +-margin, default ``growth_margin()``), else "unresolved"."""
    margin = growth_margin() if margin is None else margin
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


@dataclass(frozen=True)
class GrowthRow:
    """A group at one rate: its label (flagged at its best rate), the rate's text and an interval per metric."""

    label: str
    rate: str
    intervals: dict[str, stats.Interval]


def growth_rows(runs: StudyRuns, design: StudyDesign) -> list[GrowthRow]:
    """Every group at each matched rate and at its best rate (once when it is a matched one)."""
    out = []
    for g in design.groups:
        s = design.kept(g.label)
        if s is None:
            continue
        rates: dict[str, float] = {}
        for lr in (*design.matched_lrs, s.lr):
            rates.setdefault(rate_key(lr), lr)
        for key, lr in rates.items():
            at = design.evaluation_runs(runs, g.label, lr)
            intervals = {m: stats.interval(per_seed(at, m).values()) for m in GROWTH_METRICS}
            best = key == rate_key(s.lr)
            label = flag(design, g.label) if best else g.label
            out.append(GrowthRow(label, f"{lr:g}" + (" (best)" if best else ""), intervals))
    return out


def _growth_ratio(row: GrowthRow) -> str:
    m = row.intervals["magnitude_growth"]
    return num(math.exp(m.mean)) if math.isfinite(m.mean) else "n/a"


GROWTH_COLUMNS: list[Column[GrowthRow]] = [
    Column("scheme", lambda row: row.label),
    Column("lr", lambda row: row.rate),
    Column("ln(magnitude L / L/4)", lambda row: ci(row.intervals["magnitude_growth"])),
    Column("magnitude ratio", _growth_ratio),
    Column("slope/layer", lambda row: ci(row.intervals["magnitude_growth_slope"])),
    Column("ln(variance L / L/4)", lambda row: ci(row.intervals["variance_growth"])),
    Column("variance slope/layer", lambda row: ci(row.intervals["variance_growth_slope"])),
    Column("magnitude reads", lambda row: growth_words(row.intervals["magnitude_growth"])),
]


def growth_table(rows: Sequence[GrowthRow]) -> str:
    return table(GROWTH_COLUMNS, rows, empty="(no evaluation run yet)")


# ----------------------------------------------------------------------------- claims
def claim_name(c: ClaimResult) -> str:
    return f"{c.spec.statement} [{c.spec.source}]: {c.target} vs {c.baseline}"


def _edge_note(c: ClaimResult, design: StudyDesign) -> str:
    """Best-arm claims of a group whose best rate is still at an edge carry the flag."""
    if c.spec.arm != "best":
        return ""
    flagged = [g for g in (c.target, c.baseline) if design.selections.get(g) and design.selections[g].edge]
    return " (edge: " + ", ".join(flagged) + ")" if flagged else ""


def _rates(c: ClaimResult) -> str:
    if c.spec.arm == "best":
        t = c.tests[0]
        return f"{t.lrs[0]:g} / {t.lrs[1]:g}"
    return "; ".join(t.rate for t in c.tests) or "none"


def deciding_interval(c: ClaimResult, t: Test) -> stats.Interval:
    """The interval the claim's rule decides by: the 90 % one for an equivalence (TOST), else the 95 % one."""
    return t.difference_90 if c.spec.rule == "equivalent" else t.difference


def _differences(c: ClaimResult) -> str:
    text = "; ".join(short_ci(deciding_interval(c, t)) for t in c.tests) or "n/a"
    return text + (" (90 %)" if c.spec.rule == "equivalent" and c.tests else "")


def summary_table(items: Sequence[ClaimResult], design: StudyDesign) -> str:
    """claim | arm | rate(s) | difference [CI] | verdict | Holm-adjusted verdict: one row per claim, each matched
    rate's difference in the rate order, with the interval its rule decides by (95 %; 90 % for a TOST, marked)."""
    columns: list[Column[ClaimResult]] = [
        Column("claim", lambda c: claim_name(c) + _edge_note(c, design)),
        Column("arm", lambda c: c.spec.arm),
        Column("rate(s)", _rates),
        Column("difference [95 % CI; 90 % for ~]", _differences),
        Column("verdict", lambda c: f"**{c.verdict}**"),
        Column("Holm-adjusted verdict", lambda c: c.holm_verdict),
    ]
    return table(columns, items, empty="(no claim testable with these schemes)")


def _rule_text(c: ClaimResult) -> str:
    m = c.spec.margin_value
    if c.spec.rule == "no_worse":
        return f"upper 95% bound < +{m:g}"
    if c.spec.rule == "equivalent":
        return f"TOST: 90% CI within +-{m:g}"
    return "95% CI < 0" if c.spec.rule == "lower" else "95% CI > 0"


def _seeds_for_a_decisive_interval(c: ClaimResult, t: Test) -> str:
    """The seeds a decisive interval would take at the measured mean and spread (an inconclusive test only): a
    plug-in count for this test alone, at about 50 % power (the measured mean just reaching the bound), not a
    family-level one; the confirmation's plan gives counts at 80 % power (docs/method.md, section 10)."""
    if t.verdict != stats.INCONCLUSIVE or not t.difference.defined:
        return "-"
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
    return str(needed) if needed else "-"


def detail_table(items: Sequence[ClaimResult]) -> str:
    """Every (claim, rate) test: metric, rule with its margin, pairs, 95 % and 90 % intervals, p-values (raw and
    Holm-adjusted) and the plug-in seeds a decisive interval would take at the measured mean and spread (this test
    alone, about 50 % power)."""
    columns: list[Column[tuple[ClaimResult, Test]]] = [
        Column("claim", lambda ct: claim_name(ct[0])),
        Column("metric", lambda ct: ct[0].spec.metric + (" (ln ratio)" if metric(ct[0].spec.metric).log else "")),
        Column("rate", lambda ct: ct[1].rate),
        Column("rule", lambda ct: _rule_text(ct[0]) + (f"; {ct[0].condition}" if ct[0].condition else "")),
        Column("pairs", lambda ct: str(ct[1].difference.n)),
        Column("mean [95% CI] (min-max)", lambda ct: ci(ct[1].difference)),
        Column("90% CI", lambda ct: short_ci(ct[1].difference_90)),
        Column("p for / against", lambda ct: f"{num(ct[1].p_for)} / {num(ct[1].p_against)}"),
        Column("Holm p for / against", lambda ct: f"{num(ct[1].holm_p_for)} / {num(ct[1].holm_p_against)}"),
        Column("verdict at this rate", lambda ct: ct[1].verdict),
        Column("plug-in seeds, this test alone (~50 % power)", lambda ct: _seeds_for_a_decisive_interval(*ct)),
    ]
    return table(columns, [(c, t) for c in items for t in c.tests], empty="(no claim)")


def depth_tests(items: Sequence[ClaimResult]) -> list[tuple[ClaimResult, Test]]:
    """Every (claim, rate) test of a depth claim (a per-layer statistic's summary): the ones whose phases the
    report shows. The loss claims are left out: at step 0 every group's loss is the untrained model's, which no
    claim is about."""
    return [(c, t) for c in items if metric(c.spec.metric).statistic is not None for t in c.tests]


def _scale(c: ClaimResult) -> str:
    return "ln ratio" if metric(c.spec.metric).log else "difference of ln growths"


def phases_table(items: Sequence[ClaimResult]) -> str:
    """Every depth claim's test at each phase (``depth_tests``; ``bhyt_pl.study.report.phases``): step 0, the end
    (the number its verdict reads for a claim of the end), made by training, and where the end effect comes from."""
    columns: list[Column[tuple[ClaimResult, Test]]] = [
        Column("claim", lambda ct: claim_name(ct[0])),
        Column("rate", lambda ct: ct[1].rate),
        Column("d", lambda ct: _scale(ct[0])),
        Column("pairs", lambda ct: str(ct[1].difference.n)),
        *phase_columns(lambda ct: ct[1].phases),
    ]
    return table(columns, depth_tests(items), empty="(no depth claim)")


_LETTER = {stats.REPRODUCED: "R", stats.NOT_REPRODUCED: "N", stats.INCONCLUSIVE: "."}


def _point(p: Mapping[str, float]) -> str:
    return f"{num(p['mean'])} [{num(p['low'])}, {num(p['high'])}] @{p['tokens']:,}"


def _made_by_training(t: Test) -> str:
    return signed_ci(t.phases.training) if t.phases is not None else "-"


def training_table(items: Sequence[ClaimResult]) -> str:
    """Every (claim, rate) test at each trajectory point, as one letter per point (R reproduced, N not
    reproduced, . inconclusive), with the difference at step 0, the first trained point and the last point, and
    the difference training made (end minus step 0, paired per seed, 95 %)."""
    columns: list[Column[tuple[ClaimResult, Test]]] = [
        Column("claim", lambda ct: claim_name(ct[0])),
        Column("rate", lambda ct: ct[1].rate),
        Column(
            "verdict at each point (step 0 first)",
            lambda ct: "`" + "".join(_LETTER.get(p["verdict"], "?") for p in ct[1].over_training) + "`",
        ),
        Column("step 0", lambda ct: _point(ct[1].over_training[0])),
        Column("first trained point", lambda ct: _point(ct[1].over_training[min(1, len(ct[1].over_training) - 1)])),
        Column("last point", lambda ct: _point(ct[1].over_training[-1])),
        Column("made by training (end - step 0, 95 %)", lambda ct: _made_by_training(ct[1])),
    ]
    rows = [(c, t) for c in items for t in c.tests if t.over_training]
    return table(columns, rows, empty="(no trajectory)")


# ----------------------------------------------------------------------------- the theorem's condition
def _ratio(key: str) -> Callable[[RunResult], str]:
    return lambda r: num(r.variance_bound[key] / r.variance_bound["kappa"])


BOUND_COLUMNS: list[Column[RunResult]] = [
    Column("run", lambda r: r.spec.label),
    Column("L", lambda r: str(r.variance_bound["n_layers"])),
    Column("kappa", lambda r: num(r.variance_bound["kappa"])),
    Column("1/sqrt(L)", lambda r: num(r.variance_bound["threshold"])),
    Column("lambda_attn/kappa (init)", _ratio("lambda_attn")),
    Column("lambda_mlp/kappa (init)", _ratio("lambda_mlp")),
    Column("holds at init", lambda r: "yes" if r.variance_bound["at_init"]["all"] else "no"),
    Column("max learned lambda_attn/kappa", _ratio("learned_max_lambda_attn")),
    Column("max learned lambda_mlp/kappa", _ratio("learned_max_lambda_mlp")),
    Column("holds for learned", lambda r: "yes" if r.variance_bound["learned_holds"] else "no"),
]


def bound_table(results: Iterable[RunResult]) -> str:
    """The theorem condition ``lambda/kappa < 1/sqrt(L)`` of every run that records it, as the code computed it."""
    return table(BOUND_COLUMNS, [r for r in results if r.variance_bound], empty="(no BHyT run)")


# ----------------------------------------------------------------------------- the stability sweep
def scheme_label(r: RunResult) -> str:
    return r.spec.candidate or r.spec.label.split("@", 1)[0]


def sweep_depth(r: RunResult) -> int:
    return r.n_layers or r.spec.overrides.get("n_layers", 0)


def sweep_table(results: Sequence[RunResult]) -> str:
    """One row per (scheme, depth): the final training loss at each learning rate (one value per seed, in
    seed order), or where it diverged."""
    rates = {rate_key(r.spec.lr): r.spec.lr for r in results}
    lrs = sorted(rates.values())
    cells: dict[tuple[str, int], dict[str, str]] = {}
    for r in results:
        if r.status == RunStatus.DIVERGED:
            text = f"**diverged** @{r.diverged_step}"
        elif r.status == RunStatus.ERROR:
            text = "error"
        else:
            text = num(r.train_loss)
        cell = cells.setdefault((scheme_label(r), sweep_depth(r)), {})
        key = rate_key(r.spec.lr)
        cell[key] = f"{cell[key]} / {text}" if key in cell else text  # one value per seed
    columns: list[Column[tuple[tuple[str, int], dict[str, str]]]] = [
        Column("scheme", lambda row: row[0][0]),
        Column("layers", lambda row: str(row[0][1])),
    ]
    columns += [Column(f"lr {lr:g}", lambda row, k=rate_key(lr): row[1].get(k, "-")) for lr in lrs]
    return table(columns, list(cells.items()))

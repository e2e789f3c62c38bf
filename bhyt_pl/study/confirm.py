"""The confirmation stage (docs/method.md, section 10, "Confirmation"); its command line,
``python -m bhyt_pl study confirm --pilot DIR``, is ``bhyt_pl.study.confirm_command`` and its document
``bhyt_pl.study.confirm_report``.

A finished exploration (the *pilot*: ``python -m bhyt_pl study``) has selected each group's candidate and best rate
and fixed its matched rates; with 3 seed pairs and 43 tests it decides nothing after Holm's adjustment. The
confirmation decides a small family fixed in advance, on new seeds:

1. **Candidates** from the claims table (``bhyt_pl.study.claims.CONFIRMATION_ROWS``): every row whose roles have
   groups, with the pilot's per-seed differences (its evaluation seeds only) on the test's scale; a row marked
   ``primary`` may enter the family, every other row is exploratory with its declared reason (a theorem row whose
   condition fails on the pilot's runs too). The paper-level claims (``PAPER_CLAIMS``) are intersection-union tests
   over them.
2. **The plan** (``bhyt_pl.study.power``): which candidates form the family and how many seeds each group trains,
   written to ``OUT/plan.json`` and printed before any run; a restart reads it back and never recomputes it.
3. **The runs**: only the plan's groups, each with the pilot's candidate, at the matched rate, on seed indices above
   every index the pilot used, with the pilot's settings (model, steps, data), through the study's ``Scheduler``
   (finished runs are reused, so a stop and a restart are safe). They are written to ``OUT/runs/``; the pilot's
   folder is read, never written (``OUT`` may be a folder inside it, ``PILOT/confirmation`` by default).
4. **The verdicts** read only those runs (``family_runs`` filters by the plan's seed indices): a one-sided paired
   t-test per primary test, Holm across the family, the intersection-union verdict of each primary paper-level
   claim. ``OUT/results.json`` records them with the plan, the meta and every run; ``OUT/report.md`` and figures
   are rebuilt from it alone by ``--report-from``.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from bhyt_pl.strict_json import loads
from bhyt_pl.study import power, stats
from bhyt_pl.study.claims import CONDITIONS, CONFIRMATION_ROWS, PAPER_CLAIMS, ClaimSpec, PaperClaimSpec
from bhyt_pl.study.design import StudyDesign, StudyRuns, rate_key
from bhyt_pl.study.metrics import metric, snapshots, value
from bhyt_pl.study.plan import evaluation_seeds, run_label
from bhyt_pl.study.results import StudyRecord
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "COMMAND_PREFIX",
    "KIND",
    "PLAN_FILE",
    "ClaimVerdict",
    "ConfirmationRecord",
    "Evaluation",
    "FamilyResult",
    "Pilot",
    "candidates",
    "confirmation_specs",
    "evaluate",
    "family_runs",
    "frozen_plan",
    "load",
    "load_pilot",
    "make_confirmation_plan",
    "p_value",
]

log = logging.getLogger(__name__)

KIND = "confirmation"
"""``meta["kind"]`` of a confirmation's ``results.json`` (an exploration's record has none)."""
PLAN_FILE = "plan.json"
COMMAND_PREFIX = "python -m bhyt_pl study "
"""How a study's ``meta["command"]`` starts; the rest is the pilot's command line, parsed again for its settings."""


# ----------------------------------------------------------------------------- the pilot
@dataclass(frozen=True)
class Pilot:
    """A finished exploration as the confirmation reads it: its folder, its record and its ``results.json``'s
    SHA-256 (recorded in the plan, so a restart can tell whether the pilot changed under it)."""

    folder: Path
    record: StudyRecord
    sha256: str

    @property
    def design(self) -> StudyDesign:
        assert self.record.design is not None  # load_pilot refuses a sweep
        return self.record.design

    @cached_property
    def runs(self) -> StudyRuns:
        return StudyRuns(self.record.runs)

    @property
    def seed_indices(self) -> tuple[int, ...]:
        """Every seed index the pilot trained (its selection seed, evaluation seeds and extensions)."""
        return tuple(sorted({r.spec.seed_index for r in self.record.runs}))

    def rate(self, requested: float | None = None) -> float:
        """The matched rate the confirmation compares at: ``requested`` when it is one of the pilot's matched rates,
        else (None) the highest one, the rate the exploration's first cut keeps."""
        rates = self.design.matched_lrs
        if requested is None:
            return max(rates)
        for lr in rates:
            if rate_key(lr) == rate_key(requested):
                return lr
        raise ValueError(
            f"--rate {requested:g} is not a matched rate of the pilot; its matched rates: "
            f"{', '.join(f'{lr:g}' for lr in rates)}"
        )

    def evaluation_runs(self, group: str, lr: float) -> list[RunResult]:
        """The pilot's runs of ``group``'s kept candidate at ``lr`` on its evaluation seeds ``1..N`` only (named
        explicitly: the design's ``evaluation_runs`` keeps every seed index above the selection seed)."""
        seeds = set(evaluation_seeds(self.design.n_seeds))
        return [r for r in self.design.evaluation_runs(self.runs, group, lr) if r.spec.seed_index in seeds]


def load_pilot(folder: Path) -> Pilot:
    """The exploration in ``folder`` (its ``results.json``); a ``ValueError`` naming what is missing otherwise."""
    path = Path(folder) / "results.json"
    try:
        raw = path.read_bytes()
        data = loads(raw)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"--pilot {str(folder)!r}: cannot read its results.json ({exc}); give the folder of a "
            "finished exploration (python -m bhyt_pl study --out DIR)"
        ) from exc
    if isinstance(data, dict) and data.get("meta", {}).get("kind") == KIND:
        raise ValueError(f"--pilot {str(folder)!r} is a confirmation's folder; give the exploration's")
    record = StudyRecord.from_dict(data)
    problems = []
    if record.design is None:
        problems.append("it is a stability sweep (no design); the confirmation needs a depth study")
    else:
        missing = [g.label for g in record.design.groups if g.label not in record.design.selections]
        if missing:
            problems.append(f"its selection is unfinished for {missing}")
        if not record.design.matched_lrs:
            problems.append("it has no matched rate")
        if record.design.n_seeds < 2:
            problems.append(f"it has {record.design.n_seeds} evaluation seed(s); a pilot interval needs 2")
    if not str(record.meta.get("command", "")).startswith(COMMAND_PREFIX):
        problems.append(
            f"its meta has no study command to rebuild its settings from (got {record.meta.get('command')!r})"
        )
    raise_if_problems(f"pilot {str(folder)!r}", problems)
    return Pilot(Path(folder), record, hashlib.sha256(raw).hexdigest())


# ----------------------------------------------------------------------------- candidates and the plan
def _pilot_differences(pilot: Pilot, spec: ClaimSpec, target: str, baseline: str, rate: float | None) -> list[float]:
    """The pilot's per-seed ``d = target - baseline`` of ``spec``'s metric on its comparison scale, at ``rate`` for
    both (None: each group at its best rate)."""
    sides = []
    for group in (target, baseline):
        lr = rate if rate is not None else pilot.design.kept(group).lr
        sides.append({r.spec.seed_index: value(r, spec.metric) for r in pilot.evaluation_runs(group, lr)})
    return stats.paired_differences(*sides)


def candidates(
    pilot: Pilot,
    rate: float,
    rows: Sequence[ClaimSpec] = CONFIRMATION_ROWS,
    paper: Sequence[PaperClaimSpec] = PAPER_CLAIMS,
) -> tuple[list[power.Candidate], list[power.PaperClaim], list[str]]:
    """The plan's inputs from the pilot: a ``Candidate`` per row whose roles map to groups with a kept candidate,
    the paper-level claims whose components all are candidates, and the names of the rows left out (a role without
    a group). A matched-arm row compares at ``rate``, a best-arm row each group at its best rate; a row whose
    condition fails on the pilot's target runs is exploratory, its reason naming the condition."""
    roles = pilot.record.meta.get("roles", {})
    out: list[power.Candidate] = []
    not_tested: list[str] = []
    for spec in rows:
        target, baseline = roles.get(spec.target), roles.get(spec.baseline)
        if target is None or baseline is None or None in (pilot.design.kept(target), pilot.design.kept(baseline)):
            not_tested.append(spec.name)
            continue
        at = rate if spec.arm == "matched" else None
        exploratory = "" if spec.primary else (spec.why or "not declared for the primary family")
        if spec.condition is not None:
            holds, description = CONDITIONS[spec.condition](pilot.evaluation_runs(target, rate))
            if holds is not True:
                exploratory = f"outside its condition on the pilot's runs ({description})"
        out.append(
            power.Candidate(
                name=spec.name,
                target=target,
                baseline=baseline,
                statistic=spec.metric,
                rule=spec.rule,
                pilot=tuple(_pilot_differences(pilot, spec, target, baseline, at)),
                margin=spec.margin_value or 0.0,
                rate=at,
                exploratory=exploratory,
                why=spec.why if spec.primary else f"{spec.source}: {spec.statement}",
            )
        )
    names = {c.name for c in out}
    claims = [
        power.PaperClaim(claim.statement, claim.components, claim.why)
        for claim in paper
        if all(name in names for name in claim.components)
    ]
    return out, claims, not_tested


def make_confirmation_plan(
    pilot: Pilot, rate: float, max_seeds: int = power.MAX_SEEDS, seeds_override: int | None = None
) -> power.Plan:
    """The power plan for ``pilot`` at ``rate`` (``bhyt_pl.study.power.make_plan``); its ``source`` records the
    pilot (folder, ``results.json`` SHA-256), the rate, every group's kept candidate and the rows not tested, so the
    frozen plan alone says what the confirmation trains and reads."""
    found, claims, not_tested = candidates(pilot, rate)
    design = pilot.design
    return power.make_plan(
        found,
        claims,
        pilot_seed_indices=pilot.seed_indices,
        max_seeds=max_seeds,
        seeds_override=seeds_override,
        source={
            "pilot": str(pilot.folder),
            "pilot_results_sha256": pilot.sha256,
            "rate": rate,
            "candidates": {g.label: design.kept(g.label).candidate for g in design.groups if design.kept(g.label)},
            "not_tested": not_tested,
        },
    )


def frozen_plan(path: Path, pilot: Pilot, rate: float | None, max_seeds: int | None, seeds: int | None) -> power.Plan:
    """``path``'s plan when it exists (read back, never recomputed: ``power.load_or_create``), else a new one for
    ``pilot`` at ``rate`` (None: its highest matched rate) with ``max_seeds`` (None: ``power.MAX_SEEDS``) and
    ``seeds``, saved before it is returned. A frozen plan is checked against the pilot (its ``results.json`` may
    not have changed) and against the options given: one that asks for another plan is a ``ValueError``."""
    chosen = pilot.rate(rate)

    def make() -> power.Plan:
        return make_confirmation_plan(pilot, chosen, power.MAX_SEEDS if max_seeds is None else max_seeds, seeds)

    plan = power.load_or_create(path, make)
    problems = []
    if plan.source.get("pilot_results_sha256") != pilot.sha256:
        problems.append(
            f"the pilot's results.json changed since the plan was made (SHA-256 "
            f"{str(plan.source.get('pilot_results_sha256'))[:12]}... then, {pilot.sha256[:12]}... now)"
        )
    if max_seeds is not None and max_seeds != plan.max_seeds:
        problems.append(f"--max-seeds {max_seeds}: the plan has {plan.max_seeds}")
    if seeds is not None and seeds != plan.seeds_override:
        problems.append(f"--seeds {seeds}: the plan has {plan.seeds_override or 'its own counts'}")
    if rate is not None and rate_key(chosen) != rate_key(plan.source.get("rate", math.nan)):
        problems.append(f"--rate {rate:g}: the plan compares at {plan.source.get('rate')}")
    if problems:
        raise ValueError(
            f"{path} is frozen (written before the first run) and a restart never recomputes it, but "
            + "; ".join(problems)
            + ". Rerun without those options (or with the plan's), or give another --out to plan afresh."
        )
    return plan


# ----------------------------------------------------------------------------- the runs
def _group_rate(plan: power.Plan) -> float:
    return float(plan.source["rate"])


def confirmation_specs(plan: power.Plan, pilot: Pilot) -> list[RunSpec]:
    """The runs the plan needs: each of its groups' kept candidate at the plan's rate on the group's seed indices
    (above every pilot index), with the pilot's own settings (each spec is a pilot run's with its seed index, seeds
    and label replaced; the stability and layer-importance measurements the confirmation does not read are off).
    Ordered by seed index, then group, so an interrupted confirmation has whole pairs."""
    rate = _group_rate(plan)
    templates = {}
    for group in plan.group_seeds:
        runs = pilot.evaluation_runs(group, rate)
        if not runs:
            raise ValueError(f"the pilot has no evaluation run of group {group!r} at {rate:g} to take settings from")
        templates[group] = runs[0].spec
    specs = []
    last = max((plan.seed_indices(g)[-1] for g in plan.group_seeds), default=plan.first_seed_index - 1)
    for index in range(plan.first_seed_index, last + 1):
        for group, template in templates.items():
            if index not in plan.seed_indices(group):
                continue
            base_seed = template.seed - template.seed_index
            base_data_seed = template.data_seed - template.seed_index
            specs.append(
                replace(
                    template,
                    label=run_label(template.candidate, template.lr, template.steps, index),
                    seed_index=index,
                    seed=base_seed + index,
                    data_seed=base_data_seed + index,
                    stability_every=0,
                    importance=False,
                )
            )
    return specs


def family_runs(plan: power.Plan, runs: Iterable[RunResult], group: str) -> dict[int, RunResult]:
    """``{seed index: run}`` of ``group``'s confirmation runs: its plan candidate at the plan's rate, on the seed
    indices the plan gave it, which lie above every pilot index. Any other run (a pilot seed, another rate or
    candidate) is left out, so a verdict never reads the pilot's data."""
    if group not in plan.group_seeds:
        return {}
    # above every pilot index by the plan's construction (power.confirmation_seed_indices); filtered again here so
    # that no edit of plan.json can let a pilot seed into a verdict
    indices = {i for i in plan.seed_indices(group) if i > max(plan.pilot_seed_indices, default=-1)}
    candidate, rate = plan.source["candidates"][group], rate_key(_group_rate(plan))
    return {
        r.spec.seed_index: r
        for r in runs
        if r.spec.group == group
        and r.spec.candidate == candidate
        and rate_key(r.spec.lr) == rate
        and r.spec.seed_index in indices
    }


# ----------------------------------------------------------------------------- the verdicts
def p_value(diff: stats.Interval, rule: str, margin: float = 0.0) -> float:
    """The one-sided p-value of a test on the paired difference (``stats.one_sided_p``): ``P(T <= t)`` for
    ``lower``, ``P(T >= t)`` for ``higher``, against ``+margin`` for ``no_worse``, and the larger of the two
    one-sided p-values for ``equivalent`` (TOST). NaN with fewer than 2 pairs."""
    if rule in stats.DIRECTIONS:
        return stats.one_sided_p(diff, rule)
    if rule == "no_worse":
        return stats.one_sided_p(diff, "lower", margin)
    if rule == "equivalent":
        return max(stats.one_sided_p(diff, "higher", -margin), stats.one_sided_p(diff, "lower", margin))
    raise ValueError(f"rule must be one of {stats.RULES}, got {rule!r}")


def _verdict(p: float, alpha: float) -> str:
    if not math.isfinite(p):
        return stats.UNTESTED
    return stats.CONFIRMED if p < alpha else stats.NOT_CONFIRMED


@dataclass(frozen=True)
class FamilyResult:
    """One primary test on the confirmation's seeds.

    Args:
        planned: its frozen plan row.
        target_runs, baseline_runs: the run labels it read (the confirmation's seeds only).
        difference: the paired difference ``d`` on the test's scale, with its two-sided 95 % t-interval.
        difference_90: the same with the 90 % interval, whose bounds are the one-sided 95 % bounds.
        p: the one-sided p-value (``p_value``).
        holm_p: Holm's adjusted p-value across the family; the verdict reads it at the plan's alpha.
        verdict: ``confirmed``, ``not confirmed`` or ``untested`` (fewer than 2 pairs).
        over_training: the same test at each trajectory point (uncorrected, descriptive).
    """

    planned: power.PlannedTest
    target_runs: tuple[str, ...]
    baseline_runs: tuple[str, ...]
    difference: stats.Interval
    difference_90: stats.Interval
    p: float
    holm_p: float
    verdict: str
    over_training: tuple[dict[str, Any], ...] = ()

    @property
    def log(self) -> bool:
        """Whether ``d`` is an ln ratio (a magnitude or a variance), shown as a geometric-mean ratio."""
        return metric(self.planned.statistic).log

    @property
    def one_sided_bound(self) -> float:
        """The one-sided 95 % bound on the claim's side's far end: the upper bound for ``lower``/``no_worse``,
        the lower one for ``higher`` (NaN for ``equivalent``, which has two)."""
        rule = self.planned.rule
        if rule in ("lower", "no_worse"):
            return self.difference_90.high
        return self.difference_90.low if rule == "higher" else math.nan

    def ratio(self, confidence: float = 0.95) -> stats.GeometricMean | None:
        """The geometric mean of the per-seed ratios with its back-transformed interval (ln-ratio tests only)."""
        if not self.log:
            return None
        ln = self.difference if confidence == 0.95 else self.difference_90
        return stats.GeometricMean(ln)

    def to_dict(self) -> dict[str, Any]:
        t = self.planned
        ratio = self.ratio()
        return {
            "name": t.name,
            "statistic": t.statistic,
            "scale": "ln ratio" if self.log else "difference",
            "groups": {"target": t.target, "baseline": t.baseline},
            "rule": t.rule,
            "margin": t.margin,
            "rate": t.rate,
            "runs": {"target": list(self.target_runs), "baseline": list(self.baseline_runs)},
            "plan": t.__dict__,
            "pairs": self.difference.n,
            "difference_95": self.difference.__dict__,
            "difference_90": self.difference_90.__dict__,
            "one_sided_bound_95": self.one_sided_bound,
            "geometric_mean_ratio_95": ratio.to_dict() if ratio is not None else None,
            "p_one_sided": self.p,
            "holm_p": self.holm_p,
            "verdict": self.verdict,
            "over_training": list(self.over_training),
        }


@dataclass(frozen=True)
class ClaimVerdict:
    """A paper-level claim: its plan row and, when primary, its intersection-union test over the components'
    Holm-adjusted p-values."""

    planned: power.PlannedClaim
    iut: stats.IntersectionUnion | None = None

    @property
    def verdict(self) -> str:
        return self.iut.verdict if self.iut is not None else power.EXPLORATORY

    def to_dict(self) -> dict[str, Any]:
        c = self.planned
        return {
            "name": c.name,
            "components": list(c.components),
            "status": c.status,
            "reason": c.reason,
            "plan": {"seeds": c.seeds, "joint_power": c.joint_power},
            "p_intersection_union": self.iut.p if self.iut is not None else None,
            "failing": list(self.iut.failing) if self.iut is not None else [],
            "missing": list(self.iut.missing) if self.iut is not None else [],
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Evaluation:
    """The family's tests (in the plan's order) and the paper-level claims."""

    tests: tuple[FamilyResult, ...]
    claims: tuple[ClaimVerdict, ...]

    def test(self, name: str) -> FamilyResult:
        for t in self.tests:
            if t.planned.name == name:
                return t
        raise ValueError(f"no primary test {name!r}; the family: {[t.planned.name for t in self.tests]}")


def _over_training(
    t: power.PlannedTest, a: Mapping[int, RunResult], b: Mapping[int, RunResult], tokens_per_step: int
) -> list[dict[str, Any]]:
    """The test at every step both sides recorded, on the seeds with a snapshot there on both sides."""
    traj_a = {i: snapshots(r) for i, r in a.items()}
    traj_b = {i: snapshots(r) for i, r in b.items()}
    steps = sorted(set().union(*traj_a.values(), set()) & set().union(*traj_b.values(), set()))
    points = []
    for step in steps:
        seeds = sorted(i for i in set(traj_a) & set(traj_b) if step in traj_a[i] and step in traj_b[i])
        values = stats.paired_differences(
            {i: value(a[i], t.statistic, traj_a[i][step]) for i in seeds},
            {i: value(b[i], t.statistic, traj_b[i][step]) for i in seeds},
        )
        iv = stats.interval(values)
        points.append(
            {
                "step": step,
                "tokens": step * tokens_per_step,
                "n": iv.n,
                "mean": iv.mean,
                "low": iv.low,
                "high": iv.high,
                "p_one_sided": p_value(iv, t.rule, t.margin),
            }
        )
    return points


def evaluate(plan: power.Plan, runs: Iterable[RunResult], tokens_per_step: int = 0) -> Evaluation:
    """Every primary test of ``plan`` on the confirmation's runs (``family_runs``: never a pilot seed), Holm across
    them at the plan's alpha, and each paper-level claim: an intersection-union test of its components' adjusted
    p-values when it is primary, its plan status otherwise."""
    runs = list(runs)
    unadjusted = []
    for t in plan.primary:
        a, b = family_runs(plan, runs, t.target), family_runs(plan, runs, t.baseline)
        values = stats.paired_differences(
            {i: value(r, t.statistic) for i, r in a.items()}, {i: value(r, t.statistic) for i, r in b.items()}
        )
        d95 = stats.interval(values)
        unadjusted.append(
            FamilyResult(
                planned=t,
                target_runs=tuple(a[i].spec.label for i in sorted(a)),
                baseline_runs=tuple(b[i].spec.label for i in sorted(b)),
                difference=d95,
                difference_90=stats.interval(values, 0.90),
                p=p_value(d95, t.rule, t.margin),
                holm_p=math.nan,
                verdict=stats.UNTESTED,
                over_training=tuple(_over_training(t, a, b, tokens_per_step)),
            )
        )
    adjusted = stats.holm([t.p for t in unadjusted])
    tests = tuple(
        replace(t, holm_p=holm_p, verdict=_verdict(holm_p, plan.alpha))
        for t, holm_p in zip(unadjusted, adjusted, strict=True)
    )
    by_name = {t.planned.name: t for t in tests}
    claims = []
    for c in plan.claims:
        if not c.primary:
            claims.append(ClaimVerdict(c))
            continue
        iut = stats.intersection_union({name: by_name[name].holm_p for name in c.components}, plan.alpha)
        claims.append(ClaimVerdict(c, iut))
    return Evaluation(tests, tuple(claims))


# ----------------------------------------------------------------------------- the record
@dataclass
class ConfirmationRecord:
    """What a confirmation's ``results.json`` holds, typed: how it ran (``meta``), the frozen plan and its runs."""

    meta: dict[str, Any]
    plan: power.Plan
    runs: list[RunResult] = field(default_factory=list)

    def evaluate(self) -> Evaluation:
        return evaluate(self.plan, self.runs, int(self.meta.get("tokens_per_step", 0)))

    def to_dict(self, evaluation: Evaluation | None = None) -> dict[str, Any]:
        """The JSON document: ``meta``, the ``plan``, the ``family`` (per primary test its runs, plan row, one-sided
        p, Holm p and verdict), the ``paper_claims``, the ``exploratory`` rows with their reasons and seed counts,
        the rows ``not_tested``, then every run."""
        evaluation = evaluation or self.evaluate()
        return {
            "meta": self.meta,
            "plan": self.plan.to_dict(),
            "family": [t.to_dict() for t in evaluation.tests],
            "paper_claims": [c.to_dict() for c in evaluation.claims],
            "exploratory": [
                {
                    "name": t.name,
                    "statistic": t.statistic,
                    "rule": t.rule,
                    "margin": t.margin,
                    "rate": t.rate,
                    "status": t.status,
                    "reason": t.reason,
                    "pilot": {"n": t.pilot_n, "mean": t.pilot_mean, "low_80": t.pilot_low, "high_80": t.pilot_high},
                    "level": t.level,
                    "seeds_at_80_percent_power": t.seeds,
                    "plug_in_seeds": t.plug_in_seeds,
                }
                for t in self.plan.tests
                if not t.primary
            ],
            "not_tested": list(self.plan.source.get("not_tested", [])),
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfirmationRecord:
        """The record ``to_dict`` wrote (the verdicts are left out: they are evaluated again)."""
        missing = [key for key in ("meta", "plan", "runs") if key not in data]
        if missing or data["meta"].get("kind") != KIND:
            raise ValueError(
                f"not a confirmation's record (meta kind {data.get('meta', {}).get('kind')!r}, missing {missing})"
            )
        return cls(
            dict(data["meta"]), power.Plan.from_dict(data["plan"]), [RunResult.from_dict(r) for r in data["runs"]]
        )


def load(path: str | Path) -> ConfirmationRecord:
    """The confirmation's record in ``path`` (its ``results.json`` or the folder holding it)."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    try:
        data = loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the confirmation's record {str(path)!r}: {exc}") from exc
    return ConfirmationRecord.from_dict(data)

"""The confirmation stage (docs/method.md, section 10, "Confirmation"); its command line,
``python -m bhyt_pl study confirm --pilot DIR``, is ``bhyt_pl.study.cli.confirmation`` and its document
``bhyt_pl.study.report.confirmation``.

A finished exploration (the *pilot*: ``python -m bhyt_pl study``) has selected each group's candidate and best rate
and fixed its matched rates; with 3 seed pairs and 43 tests it decides nothing after Holm's adjustment. The
confirmation decides a small family fixed in advance, on new seeds:

1. **Candidates** from the claims table (``bhyt_pl.study.protocol.claims.CONFIRMATION_ROWS``): every row whose roles
have
   groups, with the pilot's per-seed differences (its evaluation seeds only) on the test's scale; a row marked
   ``primary`` may enter the family, every other row is exploratory with its declared reason (a theorem row whose
   condition fails on the pilot's runs too). The paper-level claims (``PAPER_CLAIMS``) are intersection-union tests
   over them.
2. **The plan** (``bhyt_pl.study.protocol.power``): which candidates form the family and how many seeds each group
trains,
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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from bhyt_pl.study.protocol import power_plan, stats
from bhyt_pl.study.protocol.claims import CONDITIONS, CONFIRMATION_ROWS, PAPER_CLAIMS, ClaimSpec, PaperClaimSpec
from bhyt_pl.study.protocol.confirmation import group_rate
from bhyt_pl.study.protocol.design import StudyDesign, StudyRuns, rate_key
from bhyt_pl.study.protocol.metrics import phase_value
from bhyt_pl.study.protocol.plan import evaluation_seeds
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, run_label
from bhyt_pl.study.record.results import RESULTS_FILE, StudyRecord, load
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "PLAN_FILE",
    "Pilot",
    "candidates",
    "confirmation_specs",
    "frozen_plan",
    "load_pilot",
    "make_confirmation_plan",
]

log = logging.getLogger(__name__)

PLAN_FILE = "plan.json"


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
    path = Path(folder) / RESULTS_FILE
    try:
        raw = path.read_bytes()
        record = load(path)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"--pilot {str(folder)!r}: cannot read its results.json ({exc}); give the folder of a "
            "finished exploration (python -m bhyt_pl study --out DIR)"
        ) from exc
    if record.kind != "exploration":
        raise ValueError(f"--pilot {str(folder)!r} is a {record.kind}'s folder; give the exploration's")
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
    if record.setup is None:
        problems.append("its record holds no setup (data, validation batches, trainer settings) to train with")
    raise_if_problems(f"pilot {str(folder)!r}", problems)
    return Pilot(Path(folder), record, hashlib.sha256(raw).hexdigest())


# ----------------------------------------------------------------------------- candidates and the plan
def _pilot_differences(pilot: Pilot, spec: ClaimSpec, target: str, baseline: str, rate: float | None) -> list[float]:
    """The pilot's per-seed ``d = target - baseline`` of ``spec``'s metric on its comparison scale at its phase (the
    end, step 0 or made by training), at ``rate`` for both (None: each group at its best rate)."""
    sides = []
    for group in (target, baseline):
        lr = rate if rate is not None else pilot.design.kept(group).lr
        runs = pilot.evaluation_runs(group, lr)
        sides.append({r.spec.seed_index: phase_value(r, spec.metric, spec.phase) for r in runs})
    return stats.paired_differences(*sides)


def candidates(
    pilot: Pilot,
    rate: float,
    rows: Sequence[ClaimSpec] = CONFIRMATION_ROWS,
    paper: Sequence[PaperClaimSpec] = PAPER_CLAIMS,
) -> tuple[list[power_plan.Candidate], list[power_plan.PaperClaim], list[str]]:
    """The plan's inputs from the pilot: a ``Candidate`` per row whose roles map to groups with a kept candidate,
    the paper-level claims whose components all are candidates, and the names of the rows left out (a role without
    a group). A matched-arm row compares at ``rate``, a best-arm row each group at its best rate; a row whose
    condition fails on the pilot's target runs is exploratory, its reason naming the condition."""
    roles = pilot.record.meta.get("roles", {})
    out: list[power_plan.Candidate] = []
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
            power_plan.Candidate(
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
                phase=spec.phase,
            )
        )
    names = {c.name for c in out}
    claims = [
        power_plan.PaperClaim(claim.statement, claim.components, claim.why)
        for claim in paper
        if all(name in names for name in claim.components)
    ]
    return out, claims, not_tested


def make_confirmation_plan(
    pilot: Pilot, rate: float, max_seeds: int = power_plan.MAX_SEEDS, seeds_override: int | None = None
) -> power_plan.Plan:
    """The power plan for ``pilot`` at ``rate`` (``bhyt_pl.study.protocol.power_plan.make_plan``); its ``source``
    records the pilot (folder, ``results.json`` SHA-256), the rate, every group's kept candidate and the rows not
    tested, so the frozen plan alone says what the confirmation trains and reads."""
    found, claims, not_tested = candidates(pilot, rate)
    design = pilot.design
    return power_plan.make_plan(
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


def frozen_plan(
    path: Path, pilot: Pilot, rate: float | None, max_seeds: int | None, seeds: int | None
) -> power_plan.Plan:
    """``path``'s plan when it exists (read back, never recomputed: ``power_plan.load_or_create``), else a new one for
    ``pilot`` at ``rate`` (None: its highest matched rate) with ``max_seeds`` (None: ``power_plan.MAX_SEEDS``) and
    ``seeds``, saved before it is returned. A frozen plan is checked against the pilot (its ``results.json`` may
    not have changed) and against the options given: one that asks for another plan is a ``ValueError``."""
    chosen = pilot.rate(rate)

    def make() -> power_plan.Plan:
        return make_confirmation_plan(pilot, chosen, power_plan.MAX_SEEDS if max_seeds is None else max_seeds, seeds)

    plan = power_plan.load_or_create(path, make)
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
def confirmation_specs(plan: power_plan.Plan, pilot: Pilot) -> list[RunSpec]:
    """The runs the plan needs: each of its groups' kept candidate at the plan's rate on the group's seed indices
    (above every pilot index), with the pilot's own settings (each spec is a pilot run's with its seed index, seeds
    and label replaced; the stability and layer-importance measurements the confirmation does not read are off).
    Ordered by seed index, then group, so an interrupted confirmation has whole pairs."""
    rate = group_rate(plan)
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

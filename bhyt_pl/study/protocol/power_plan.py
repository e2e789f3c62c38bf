"""The confirmation's power plan: which pairwise tests form the primary family, and how many new seeds each group
trains, decided from the exploration's (the pilot's) per-seed differences before any confirmation run, then frozen.

The rule (docs/method.md, section 10, "Confirmation") builds on ``bhyt_pl.study.protocol.power``: each test's
effect shrunk, its SD inflated, and the seeds for power 0.8 of its one-sided paired t-test at the level
``alpha / m`` for a family of ``m`` tests (Holm's first, most stringent step: the plan's power is a lower bound
for Holm's). A test whose shrunk effect is not positive is *infeasible* and stays out of the family.

1. **Dropping.** While some test needs more than ``max_seeds``, the one that needs the most leaves the family
   (``m`` falls, the level rises, the others need fewer seeds). One at a time, so that a test which fits once
   a costlier one has left is kept.
2. **Paper-level claims** ("BHyT has the lowest X": an intersection-union test over its baselines) plan for joint
   power >= 0.8, the product of the components' powers at a common seed count. A claim with a component that is
   not in the family (declared exploratory, infeasible or dropped) stays exploratory, naming that component.
3. **Seeds per group**: the largest count over the family's tests and claims the group is in; ``seeds_override``
   (``--seeds N``) replaces every count. The seed indices start above every index the pilot used.

The plan is written to ``plan.json`` before any run and read back on a restart, never recomputed
(``load_or_create``). It takes plain numbers, not the study's result types, so it does not change when they do.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bhyt_pl import strict_json
from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.metrics import END, PHASES
from bhyt_pl.study.protocol.power import (
    MIN_SEEDS,
    POWER,
    SD_CONFIDENCE,
    SEARCH_LIMIT,
    SHRINK_CONFIDENCE,
    confirmation_seed_indices,
    inflated_sd,
    power_at,
    room_inside,
    seeds_for_power,
    shrunk_effect,
)
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "DROPPED",
    "EXPLORATORY",
    "INFEASIBLE",
    "MAX_SEEDS",
    "PLAN_VERSION",
    "PRIMARY",
    "Candidate",
    "PaperClaim",
    "Plan",
    "PlannedClaim",
    "PlannedTest",
    "load_or_create",
    "make_plan",
]

log = logging.getLogger(__name__)

PLAN_VERSION = 1
MAX_SEEDS = 12
"""Default ``max_seeds``: a test that needs more leaves the family (``--max-seeds``)."""

PRIMARY, INFEASIBLE, DROPPED, EXPLORATORY = "primary", "infeasible", "dropped", "exploratory"


@dataclass(frozen=True)
class Candidate:
    """A pairwise test the family may hold: one directional comparison of two groups and the pilot's differences.

    Args:
        name: unique key of the test (the text the report prints), e.g. ``BHyT < RMSNorm: median magnitude``.
        target, baseline: the groups compared (``--schemes`` labels: what trains), ``d = target - baseline``.
        statistic: what ``d`` measures (a ``bhyt_pl.study.protocol.metrics.METRICS`` name).
        rule: ``lower``, ``higher``, ``no_worse`` or ``equivalent`` (as in the claims table).
        pilot: the pilot's per-seed paired differences on the test's scale (non-finite values are left out).
        margin: for ``no_worse`` and ``equivalent``.
        rate: the learning rate the test compares at (``None``: each group at its own best rate).
        exploratory: a reason, declared in advance, to keep the test out of the family (e.g. the baseline did not
            train); the plan still prints the seeds it would need.
        why: the reason it is a candidate (the paper statement it tests), for the reader.
        phase: when ``statistic`` is read (``bhyt_pl.study.protocol.metrics.PHASES``): at the end (default), at
            initialisation, or made by training (end minus step 0).
    """

    name: str
    target: str
    baseline: str
    statistic: str
    rule: str
    pilot: tuple[float, ...]
    margin: float = 0.0
    rate: float | None = None
    exploratory: str = ""
    why: str = ""
    phase: str = END

    def __post_init__(self) -> None:
        object.__setattr__(self, "pilot", tuple(math.nan if v is None else float(v) for v in self.pilot))


@dataclass(frozen=True)
class PaperClaim:
    """A claim of the form "BHyT has the lowest X": an intersection-union test over one candidate per baseline.

    Args:
        name: the claim in the paper's words.
        components: candidate names, one per baseline.
        why: the paper statement it tests.
    """

    name: str
    components: tuple[str, ...]
    why: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))


@dataclass(frozen=True)
class PlannedTest:
    """One row of the plan.

    ``effect`` and ``sd`` are what the plan assumes (shrunk, inflated); ``seeds`` the count for power 0.8 at
    ``level`` (None: infeasible, or more than ``SEARCH_LIMIT``); ``plug_in_seeds`` the count if the pilot's mean and
    SD were the truth (for a reader of the exploratory rows; never used to plan). For a primary test, ``pairs`` is
    the number of pairs it will get (the smaller of its two groups' seed counts) and ``power`` its power there.
    A dropped test's ``level`` is the one it had when it left the family; the other rows' is the one they would
    have if they joined it (``alpha / (m + 1)``). ``phase`` is its candidate's.
    """

    name: str
    target: str
    baseline: str
    statistic: str
    rule: str
    margin: float
    rate: float | None
    pilot_n: int
    pilot_mean: float
    pilot_sd: float
    pilot_low: float
    pilot_high: float
    effect: float
    sd: float
    level: float
    seeds: int | None
    plug_in_seeds: int | None
    status: str
    reason: str
    pairs: int = 0
    power: float = math.nan
    why: str = ""
    phase: str = END

    @property
    def primary(self) -> bool:
        return self.status == PRIMARY

    def to_dict(self) -> dict[str, object]:
        """The row as ``plan.json`` holds it: ``phase`` only when it is not the end, so a plan of end-only tests
        reads as it did before tests had phases."""
        row = asdict(self)
        if self.phase == END:
            del row["phase"]
        return row


@dataclass(frozen=True)
class PlannedClaim:
    """A paper-level claim in the plan: ``primary`` when every component is, with the seed count for joint power
    0.8 (``seeds``) and the joint power at the pairs its components will get; else ``exploratory`` with the
    reason naming each component that keeps it out."""

    name: str
    components: tuple[str, ...]
    status: str
    reason: str
    seeds: int | None = None
    joint_power: float = math.nan
    why: str = ""

    @property
    def primary(self) -> bool:
        return self.status == PRIMARY


@dataclass(frozen=True)
class Plan:
    """The frozen power plan of a confirmation: its rule's parameters, every candidate's row, the paper-level
    claims, and the seeds each group trains. Written to ``plan.json`` before any run (``save``) and read back on
    a restart (``load_or_create``)."""

    alpha: float
    power: float
    max_seeds: int
    min_seeds: int
    shrink_confidence: float
    sd_confidence: float
    family_size: int
    level: float
    tests: tuple[PlannedTest, ...]
    claims: tuple[PlannedClaim, ...]
    group_seeds: dict[str, int]
    first_seed_index: int
    pilot_seed_indices: tuple[int, ...]
    seeds_override: int | None = None
    source: dict[str, object] = field(default_factory=dict)
    version: int = PLAN_VERSION

    @property
    def primary(self) -> list[PlannedTest]:
        """The family's tests, in the order they were declared; Holm runs across these."""
        return [t for t in self.tests if t.primary]

    @property
    def runs(self) -> int:
        """Runs the confirmation trains: every group's seed count, summed."""
        return sum(self.group_seeds.values())

    def seed_indices(self, group: str) -> range:
        """The seed indices ``group`` trains: the same first indices for every group, so runs pair by seed."""
        if group not in self.group_seeds:
            raise ValueError(
                f"group {group!r} trains no confirmation run; the plan's groups are {sorted(self.group_seeds)}"
            )
        return range(self.first_seed_index, self.first_seed_index + self.group_seeds[group])

    def test(self, name: str) -> PlannedTest:
        for t in self.tests:
            if t.name == name:
                return t
        raise ValueError(f"no test {name!r} in the plan; its tests are {[t.name for t in self.tests]}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"tests": [t.to_dict() for t in self.tests]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        version = data.get("version", 0)
        if version != PLAN_VERSION:
            raise ValueError(f"plan.json has version {version!r}; this bhyt_pl reads version {PLAN_VERSION}")
        data = dict(data)
        data["tests"] = tuple(PlannedTest(**t) for t in data["tests"])
        data["claims"] = tuple(PlannedClaim(**{**c, "components": tuple(c["components"])}) for c in data["claims"])
        data["pilot_seed_indices"] = tuple(data["pilot_seed_indices"])
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        """Write the plan as strict JSON (``bhyt_pl.strict_json``) atomically, so a stop while writing leaves
        either no ``plan.json`` or a whole one."""
        return strict_json.write(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(strict_json.loads(Path(path).read_text()))


# --- the plan ----------------------------------------------------------------------------------------------------


def _validate(
    candidates: Sequence[Candidate],
    claims: Sequence[PaperClaim],
    alpha: float,
    power: float,
    max_seeds: int,
    min_seeds: int,
    seeds_override: int | None,
) -> None:
    problems: list[str] = []
    names = [c.name for c in candidates]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"candidate names must be unique, repeated: {duplicates}")
    for c in candidates:
        if c.phase not in PHASES:
            problems.append(f"candidate {c.name!r}: phase must be one of {PHASES}, got {c.phase!r}")
        if c.rule not in stats.RULES:
            problems.append(f"candidate {c.name!r}: rule must be one of {stats.RULES}, got {c.rule!r}")
        elif c.rule in ("no_worse", "equivalent") and not c.margin > 0:
            problems.append(f"candidate {c.name!r}: rule {c.rule!r} needs a margin > 0, got {c.margin}")
    for claim in claims:
        unknown = [n for n in claim.components if n not in names]
        if unknown or not claim.components:
            problems.append(
                f"claim {claim.name!r}: components must be candidate names, unknown: {unknown or 'none given'}"
            )
    if not 0 < alpha < 1:
        problems.append(f"alpha must lie in (0, 1), got {alpha}")
    if not 0 < power < 1:
        problems.append(f"power must lie in (0, 1), got {power}")
    if min_seeds < 2:
        problems.append(f"min_seeds must be >= 2 (a t-test needs one degree of freedom), got {min_seeds}")
    if max_seeds < min_seeds:
        problems.append(f"max_seeds must be >= min_seeds ({min_seeds}), got {max_seeds}")
    if seeds_override is not None and seeds_override < 2:
        problems.append(f"seeds_override (--seeds) must be >= 2 (a t-test needs 2 pairs), got {seeds_override}")
    raise_if_problems("power plan", problems)


@dataclass
class _Row:
    """A candidate's pilot summary and the plan's assumptions, before the family is settled."""

    candidate: Candidate
    n: int
    mean: float
    sd: float
    low: float
    high: float
    effect: float
    inflated: float
    _seeds: dict[tuple[float, float, int], int | None] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.candidate.name

    def power(self, n: int, level: float) -> float:
        """Power at ``n`` pairs under the plan's assumptions (shrunk effect, inflated SD)."""
        return power_at(n, self.effect, self.inflated, level, self.candidate.rule, self.candidate.margin)

    def seeds(self, level: float, power: float, minimum: int) -> int | None:
        """Seeds for ``power`` at ``level`` under the plan's assumptions (cached: settling the family asks often)."""
        key = (level, power, minimum)
        if key not in self._seeds:
            self._seeds[key] = seeds_for_power(lambda n: self.power(n, level), power, minimum)
        return self._seeds[key]

    def plug_in_seeds(self, level: float, power: float, minimum: int) -> int | None:
        c = self.candidate
        if self.n < 2:
            return None
        effect = room_inside(c.rule, c.margin, self.mean, self.mean)
        return seeds_for_power(lambda n: power_at(n, effect, self.sd, level, c.rule, c.margin), power, minimum)


def _pilot_row(c: Candidate, shrink_confidence: float, sd_confidence: float) -> _Row:
    iv80 = stats.interval(c.pilot, shrink_confidence)
    sd = stats.interval(c.pilot).sd
    return _Row(
        c,
        iv80.n,
        iv80.mean,
        sd,
        iv80.low,
        iv80.high,
        shrunk_effect(c.pilot, c.rule, c.margin, shrink_confidence),
        inflated_sd(sd, iv80.n, sd_confidence),
    )


def _settle_family(
    rows: list[_Row], alpha: float, power: float, max_seeds: int, min_seeds: int
) -> tuple[list[_Row], dict[str, int]]:
    """The family the dropping rule keeps (module docstring, step 1), in the order the rows were given, and for
    each dropped test the family size at which it left (its level was ``alpha / size`` then).

    Dropping the costliest test first keeps the largest family that fits: a one-sided test's seed count depends on
    its effect / SD ratio and the level alone, so a test that needs more seeds than another at one level needs
    more at every level, and no dropped test could rejoin once a cheaper one has left.
    """

    def needs(row: _Row, m: int) -> float:
        n = row.seeds(alpha / m, power, min_seeds)
        return math.inf if n is None else n

    family = list(rows)
    dropped: dict[str, int] = {}
    while family:
        cost = [needs(r, len(family)) for r in family]
        worst = max(range(len(family)), key=lambda i: cost[i])  # max keeps the first of equals: the earlier one
        if cost[worst] <= max_seeds:
            break
        dropped[family[worst].name] = len(family)
        del family[worst]
    return family, dropped


def make_plan(
    candidates: Sequence[Candidate],
    claims: Sequence[PaperClaim] = (),
    *,
    pilot_seed_indices: Iterable[int],
    alpha: float = stats.ALPHA,
    power: float = POWER,
    max_seeds: int = MAX_SEEDS,
    min_seeds: int = MIN_SEEDS,
    seeds_override: int | None = None,
    shrink_confidence: float = SHRINK_CONFIDENCE,
    sd_confidence: float = SD_CONFIDENCE,
    source: Mapping[str, object] | None = None,
) -> Plan:
    """The confirmation's plan from the pilot's per-seed differences (the rule: module docstring).

    Args:
        candidates: every pairwise test the report will show; those not declared exploratory may enter the family.
        claims: paper-level claims over the candidates (intersection-union tests).
        pilot_seed_indices: every seed index the pilot used; the confirmation's start above the largest.
        alpha: the family-wise level Holm controls.
        power: the power each test (and each claim, jointly) is planned for.
        max_seeds: a test that needs more seeds leaves the family (``--max-seeds``).
        min_seeds: the fewest seeds a test is given (``MIN_SEEDS`` says why 3).
        seeds_override: every group of the family trains this many seeds instead (``--seeds N``); the family
            itself is still the one ``max_seeds`` leaves, and each row records its power at the override.
        shrink_confidence, sd_confidence: the pilot interval the effect is shrunk to, the SD bound it is inflated to.
        source: what the plan was made from (the pilot's folder, its rate), recorded in ``plan.json``.
    """
    _validate(candidates, claims, alpha, power, max_seeds, min_seeds, seeds_override)
    pilot_seed_indices = tuple(sorted({int(i) for i in pilot_seed_indices}))
    first = confirmation_seed_indices(pilot_seed_indices, 0).start
    rows = {c.name: _pilot_row(c, shrink_confidence, sd_confidence) for c in candidates}
    eligible = [r for r in rows.values() if not r.candidate.exploratory and r.effect > 0]
    family, dropped_at = _settle_family(eligible, alpha, power, max_seeds, min_seeds)
    m = len(family)
    level = alpha / max(m, 1)
    # the family's tests at its level; a dropped test at the level it had when it left; any other at the level it
    # would have if it joined (what a reader of the exploratory rows wants: the seeds it would need)
    levels = {name: alpha / dropped_at.get(name, m + 1) for name in rows} | {r.name: level for r in family}
    seeds = {name: r.seeds(levels[name], power, min_seeds) for name, r in rows.items()}
    status = {name: _status(r, dropped_at, seeds[name], max_seeds, shrink_confidence) for name, r in rows.items()}

    claim_rows = [_claim_row(claim, rows, status, level, power, max_seeds, min_seeds) for claim in claims]

    # seeds per group: the largest count over the family's tests and primary claims the group is in
    group_seeds: dict[str, int] = {}
    for name, n in [(r.name, seeds[r.name]) for r in family] + [
        (part, cp.seeds) for cp in claim_rows if cp.primary for part in cp.components
    ]:
        for group in (rows[name].candidate.target, rows[name].candidate.baseline):
            group_seeds[group] = max(group_seeds.get(group, 0), n)
    if seeds_override is not None:
        group_seeds = {g: seeds_override for g in group_seeds}

    def pairs(name: str) -> int:
        c = rows[name].candidate
        return min(group_seeds[c.target], group_seeds[c.baseline]) if status[name][0] == PRIMARY else 0

    tests = tuple(
        _test_row(r, status[name], levels[name], seeds[name], pairs(name), power, min_seeds) for name, r in rows.items()
    )
    claim_rows = [
        replace(cp, joint_power=math.prod(rows[n].power(pairs(n), level) for n in cp.components)) if cp.primary else cp
        for cp in claim_rows
    ]
    return Plan(
        alpha=alpha,
        power=power,
        max_seeds=max_seeds,
        min_seeds=min_seeds,
        shrink_confidence=shrink_confidence,
        sd_confidence=sd_confidence,
        family_size=m,
        level=level,
        tests=tests,
        claims=tuple(claim_rows),
        group_seeds=group_seeds,
        first_seed_index=first,
        pilot_seed_indices=pilot_seed_indices,
        seeds_override=seeds_override,
        source=dict(source or {}),
    )


def _status(
    r: _Row, dropped_at: dict[str, int], seeds: int | None, max_seeds: int, shrink_confidence: float
) -> tuple[str, str]:
    """``(status, reason)`` of a candidate once the family is settled."""
    c = r.candidate
    if c.exploratory:
        return EXPLORATORY, c.exploratory
    if not r.effect > 0:
        if r.n < 2:
            return INFEASIBLE, f"the pilot has {r.n} pair(s); an interval needs 2"
        boundary = {"lower": "0", "higher": "0", "no_worse": f"+{c.margin:g}", "equivalent": f"+-{c.margin:g}"}
        interval = f"[{r.low:+.3f}, {r.high:+.3f}]"
        return INFEASIBLE, f"the pilot's {shrink_confidence:.0%} interval {interval} reaches {boundary[c.rule]}"
    if c.name in dropped_at:
        need = f"more than {SEARCH_LIMIT}" if seeds is None else str(seeds)
        return DROPPED, f"needs {need} seeds at alpha / {dropped_at[c.name]} > max_seeds {max_seeds}"
    return PRIMARY, ""


def _claim_row(
    claim: PaperClaim,
    rows: dict[str, _Row],
    status: dict[str, tuple[str, str]],
    level: float,
    power: float,
    max_seeds: int,
    min_seeds: int,
) -> PlannedClaim:
    """A paper-level claim: exploratory unless every component is in the family and joint power fits."""
    out = [
        f"{name} is {status[name][0]} ({status[name][1]})" for name in claim.components if status[name][0] != PRIMARY
    ]
    if out:
        return PlannedClaim(claim.name, claim.components, EXPLORATORY, "; ".join(out), why=claim.why)
    parts = [rows[name] for name in claim.components]
    # joint power as the product: exact for independent components; the components share the target's runs,
    # which correlates them positively, and then the product is a lower bound (the plan errs towards more seeds)
    n = seeds_for_power(lambda k: math.prod(p.power(k, level) for p in parts), power, min_seeds)
    if n is None or n > max_seeds:
        need = f"more than {SEARCH_LIMIT}" if n is None else str(n)
        reason = f"joint power {power:g} needs {need} seeds > max_seeds {max_seeds}"
        return PlannedClaim(claim.name, claim.components, EXPLORATORY, reason, n, why=claim.why)
    return PlannedClaim(claim.name, claim.components, PRIMARY, "", n, why=claim.why)


def _test_row(
    r: _Row, status: tuple[str, str], level: float, seeds: int | None, pairs: int, power: float, min_seeds: int
) -> PlannedTest:
    c = r.candidate
    return PlannedTest(
        name=c.name,
        target=c.target,
        baseline=c.baseline,
        statistic=c.statistic,
        rule=c.rule,
        margin=c.margin,
        rate=c.rate,
        pilot_n=r.n,
        pilot_mean=r.mean,
        pilot_sd=r.sd,
        pilot_low=r.low,
        pilot_high=r.high,
        effect=r.effect,
        sd=r.inflated,
        level=level,
        seeds=seeds,
        plug_in_seeds=r.plug_in_seeds(level, power, min_seeds),
        status=status[0],
        reason=status[1],
        pairs=pairs,
        power=r.power(pairs, level) if pairs else math.nan,
        why=c.why,
        phase=c.phase,
    )


def load_or_create(path: str | Path, make: Callable[[], Plan]) -> Plan:
    """The plan at ``path`` if one exists (a restart: read back, never recomputed, whatever the inputs are now);
    otherwise ``make()``, saved to ``path`` before it is returned, so it is frozen before any run starts."""
    path = Path(path)
    if path.exists():
        log.info("confirmation: %s exists; using its plan (a plan is frozen once written)", path)
        return Plan.load(path)
    plan = make()
    plan.save(path)
    return plan

"""The token-budget map's design: which budgets it trains, how each budget's learning rates are chosen, and what it
records of the choice (docs/method.md, section 11).

A budget is a ratio of training tokens to P, the block-matrix parameters (``bhyt_pl.model_size``); each is a full run
with its own schedule (warmup and cosine decay over its own steps), never a cut from a longer run. Every scheme
group picks its rate per budget on the selection seed (protocol v3's steps 1-2, ``bhyt_pl.study.protocol.plan``);
the evaluation seeds then train at that rate. Budgets past ``select_through`` inherit the rate their largest
selected budget chose (a rule stated before the run, for maps whose largest budget is too dear to select at);
no budget takes a rate chosen for all budgets at once.

The early point of a run is the step the saturation rule reads (``early_step``): 5 % of its steps, never before
step 10 (docs/method.md says why those numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bhyt_pl.model_size import steps_for_tokens_per_param
from bhyt_pl.study.protocol.design import SchemeGroup, Selection, StudyRuns, parse_group
from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = [
    "EARLY_FRACTION",
    "EARLY_MIN_STEP",
    "BudgetDesign",
    "TokenBudget",
    "budget_base",
    "budget_runs",
    "early_step",
    "token_budgets",
]

EARLY_FRACTION = 0.05
"""The saturation rule's early point, as a fraction of a run's steps."""
EARLY_MIN_STEP = 10
"""...but never before this step: the first steps' statistics are the initialisation's, not training's."""


def early_step(steps: int) -> int:
    """The step at which the saturation rule reads a run of ``steps`` steps: ``ceil(0.05 x steps)``, at least 10,
    at most ``steps``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return min(steps, max(EARLY_MIN_STEP, math.ceil(EARLY_FRACTION * steps)))


@dataclass(frozen=True)
class TokenBudget:
    """One budget: its T/P ratio as asked, the whole steps that come closest to it, and its early point.

    Args:
        ratio: the tokens per block-matrix parameter asked for.
        steps: optimizer steps (``steps_for_tokens_per_param``).
        early_step: the step the saturation rule reads (``early_step``); trajectory points fall every this many
            steps, so the run records it.
    """

    ratio: float
    steps: int
    early_step: int

    @property
    def label(self) -> str:
        """``T/P 0.015``'s key in the record: the ratio as given (``0.015``)."""
        return f"{self.ratio:g}"

    def tokens(self, tokens_per_step: int) -> int:
        return self.steps * tokens_per_step

    def to_dict(self) -> dict[str, object]:
        return {"ratio": self.ratio, "steps": self.steps, "early_step": self.early_step}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenBudget:
        return cls(float(data["ratio"]), int(data["steps"]), int(data["early_step"]))


def token_budgets(ratios: Sequence[float], block_params: int, tokens_per_step: int) -> tuple[TokenBudget, ...]:
    """The budgets of ``ratios`` (ascending), each rounded to whole steps of ``tokens_per_step`` tokens. Two ratios
    that round to the same steps would be the same runs: a ``ValueError`` names them, as does a ratio that is not
    positive or repeats."""
    if not ratios:
        raise ValueError("--budgets: give at least one tokens-per-parameter ratio")
    bad = [r for r in ratios if not r > 0]
    if bad:
        raise ValueError(f"--budgets must be > 0, got {bad}")
    ordered = sorted(ratios)
    budgets = []
    for ratio in ordered:
        steps = steps_for_tokens_per_param(ratio, block_params, tokens_per_step)
        budgets.append(TokenBudget(float(ratio), steps, early_step(steps)))
    steps = [b.steps for b in budgets]
    if len(set(steps)) != len(steps):
        pairs = ", ".join(f"T/P {b.label}: {b.steps} steps" for b in budgets)
        raise ValueError(f"--budgets: two ratios round to the same number of steps ({pairs}); space them further")
    return tuple(budgets)


def budget_base(base: RunSpec, budget: TokenBudget) -> RunSpec:
    """``base`` for one budget: its steps, a trajectory point at every early step (so the early point is recorded),
    and a spike window scaled to its length."""
    return replace(
        base,
        steps=budget.steps,
        trajectory_every=budget.early_step,
        spike_window=max(2, min(32, budget.steps // 4)),
    )


@dataclass
class BudgetDesign:
    """What the map compares and what the protocol chose, filled in place as selections finish.

    Args:
        groups: the scheme groups, in table order.
        reference: the group every loss difference is taken against (``rmsnorm``).
        budgets: the budgets, ascending.
        grids: each group's learning-rate grid on the selection seed.
        n_seeds: evaluation seeds per (group, budget) (indices ``1 .. n_seeds``).
        extensions: grid steps a group may add past an edge of its grid, per budget.
        select_through: how many of the smallest budgets select their rates; each larger one inherits the rate of
            the largest of those (``donor``). ``len(budgets)``: every budget selects.
        selections: budget label -> group label -> its ``Selection`` on that budget.
    """

    groups: tuple[SchemeGroup, ...]
    reference: str
    budgets: tuple[TokenBudget, ...]
    grids: dict[str, tuple[float, ...]]
    n_seeds: int
    extensions: int = 1
    select_through: int = 0
    selections: dict[str, dict[str, Selection]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.groups = tuple(self.groups)
        labels = [g.label for g in self.groups]
        if self.reference not in labels:
            raise ValueError(f"--reference {self.reference!r} must be one of the --schemes groups {labels}")
        missing = [g for g in labels if not self.grids.get(g)]
        if missing:
            raise ValueError(f"budget design: groups without a learning-rate grid: {missing}")
        if not self.select_through:
            self.select_through = len(self.budgets)
        if not 1 <= self.select_through <= len(self.budgets):
            raise ValueError(
                f"--select-through must be between 1 and the {len(self.budgets)} budgets, got {self.select_through}"
            )

    def group(self, label: str) -> SchemeGroup:
        for g in self.groups:
            if g.label == label:
                return g
        raise ValueError(f"budget design: no group {label!r}; groups: {[g.label for g in self.groups]}")

    def budget(self, label: str) -> TokenBudget:
        for b in self.budgets:
            if b.label == label:
                return b
        raise ValueError(f"budget design: no budget {label!r}; budgets: {[b.label for b in self.budgets]}")

    @property
    def selected_budgets(self) -> tuple[TokenBudget, ...]:
        """The budgets that select their own rates."""
        return self.budgets[: self.select_through]

    def donor(self, budget: TokenBudget) -> TokenBudget:
        """The budget whose selection sets ``budget``'s rates: itself, or the largest selected budget."""
        return budget if budget in self.selected_budgets else self.selected_budgets[-1]

    def selection(self, budget: TokenBudget, group: str) -> Selection | None:
        """``group``'s selection for ``budget`` (its donor's for an inheriting budget); None until it is made."""
        return self.selections.get(self.donor(budget).label, {}).get(group)

    def evaluation_runs(self, runs: Sequence[RunResult], budget: TokenBudget, group: str) -> dict[int, RunResult]:
        """``{seed index: run}`` of ``group``'s evaluation seeds on ``budget`` (at its selected or inherited rate),
        empty before the selection or when no candidate trained."""
        s = self.selection(budget, group)
        if s is None or s.chosen is None:
            return {}
        return {r.spec.seed_index: r for r in budget_runs(runs, budget).evaluation(group, s.candidate, s.lr)}

    def to_dict(self) -> dict[str, object]:
        return {
            "groups": [g.label for g in self.groups],
            "reference": self.reference,
            "budgets": [b.to_dict() for b in self.budgets],
            "grids": {g: list(lrs) for g, lrs in self.grids.items()},
            "seeds": self.n_seeds,
            "extensions": self.extensions,
            "select_through": self.select_through,
            "selections": {b: {g: s.to_dict() for g, s in by.items()} for b, by in self.selections.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], runs: Sequence[RunResult]) -> BudgetDesign:
        """The design ``to_dict`` wrote, its runs found in ``runs`` (groups parsed again)."""
        keys = ("groups", "reference", "budgets", "grids", "seeds", "select_through", "selections")
        missing = [key for key in keys if key not in data]
        if missing:
            raise ValueError(f"budgets: missing {missing}; a budget design has {list(keys)}")
        return cls(
            groups=tuple(parse_group(label) for label in data["groups"]),
            reference=str(data["reference"]),
            budgets=tuple(TokenBudget.from_dict(b) for b in data["budgets"]),
            grids={str(g): tuple(float(lr) for lr in lrs) for g, lrs in data["grids"].items()},
            n_seeds=int(data["seeds"]),
            extensions=int(data.get("extensions", 1)),
            select_through=int(data["select_through"]),
            selections={},
        ).with_selections(data["selections"], runs)

    def with_selections(self, data: Mapping[str, Any], runs: Sequence[RunResult]) -> BudgetDesign:
        """``self`` with the selections ``to_dict`` wrote, each found among its own budget's runs."""
        for label, by_group in data.items():
            found = budget_runs(runs, self.budget(str(label)))
            self.selections[str(label)] = {str(g): Selection.from_dict(g, s, found) for g, s in by_group.items()}
        return self


def budget_runs(runs: Sequence[RunResult], budget: TokenBudget) -> StudyRuns:
    """The runs of one budget (its step count), found by key or label: a run's key (group, candidate, rate, seed)
    is unique within a budget, not across budgets."""
    return StudyRuns(r for r in runs if r.spec.steps == budget.steps)

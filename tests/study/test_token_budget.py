"""The token-budget map's design (``bhyt_pl.study.protocol.token_budget``): a budget's steps from its T/P, the early
point, the inheritance rule and the record's round trip, against hand computation."""

from __future__ import annotations

import pytest
from study_fixtures import BASE, fake_result

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model_size import block_params
from bhyt_pl.study.protocol.design import Selection, parse_group
from bhyt_pl.study.protocol.plan import evaluation_specs, selection_specs
from bhyt_pl.study.protocol.token_budget import (
    BudgetDesign,
    TokenBudget,
    budget_base,
    budget_runs,
    early_step,
    token_budgets,
)

DEEP_16X64_P = 786_432  # 16 x (64 x 32 x (2 x 2 + 2 x 1) + 3 x 64 x 192) = 16 x (12,288 + 36,864)


def test_a_budget_s_steps_are_its_t_over_p_times_p_over_the_tokens_a_step() -> None:
    assert block_params(LlamaConfig.from_name("deep-16x64")) == DEEP_16X64_P
    budgets = token_budgets([1.0, 0.015, 0.35, 0.043, 0.12], DEEP_16X64_P, 8 * 64)
    # T/P x P / 512, to the nearest step: 23.04 -> 23, 66.05 -> 66, 184.3 -> 184, 537.6 -> 538, 1536
    assert [(b.ratio, b.steps) for b in budgets] == [(0.015, 23), (0.043, 66), (0.12, 184), (0.35, 538), (1.0, 1536)]
    # the early point: ceil(5 % of the steps), never before step 10
    assert [b.early_step for b in budgets] == [10, 10, 10, 27, 77]
    assert budgets[0].tokens(512) == 23 * 512 and budgets[0].label == "0.015"


def test_early_step_rounds_up_and_never_passes_the_run() -> None:
    assert [early_step(s) for s in (1, 9, 10, 200, 201, 220, 1000)] == [1, 9, 10, 10, 11, 11, 50]
    with pytest.raises(ValueError, match="steps must be >= 1"):
        early_step(0)


@pytest.mark.parametrize(("ratios", "message"), [([], "at least one"), ([0.1, -1.0], "must be > 0")])
def test_bad_budgets_fail_naming_the_option(ratios: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_budgets(ratios, DEEP_16X64_P, 512)


def test_two_ratios_that_round_to_the_same_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="round to the same number of steps"):
        token_budgets([0.01, 0.0103], DEEP_16X64_P, 51_200)


def _design(select_through: int = 0) -> BudgetDesign:
    groups = (parse_group("rmsnorm"), parse_group("bhyt"))
    budgets = token_budgets([0.015, 0.043, 0.12], DEEP_16X64_P, 512)
    return BudgetDesign(groups, "rmsnorm", budgets, {"rmsnorm": (1e-3, 3e-3), "bhyt": (3e-3,)}, 2, 1, select_through)


def test_larger_budgets_inherit_the_largest_selected_budget_s_rate() -> None:
    design = _design(select_through=2)
    small, middle, large = design.budgets
    assert design.selected_budgets == (small, middle)
    assert design.donor(large) is middle and design.donor(small) is small
    chosen = fake_result(selection_specs(design.group("bhyt"), (3e-3,), budget_base(BASE, middle))[0], 4.0)
    design.selections[middle.label] = {"bhyt": Selection("bhyt", chosen, (chosen,))}
    assert design.selection(large, "bhyt").lr == 3e-3
    assert design.selection(small, "bhyt") is None


def test_select_through_must_name_a_selected_budget() -> None:
    with pytest.raises(ValueError, match="--select-through must be between 1 and the 3 budgets"):
        _design(select_through=4)
    assert _design().select_through == 3  # 0: every budget selects


def test_the_reference_and_every_grid_must_exist() -> None:
    groups = (parse_group("rmsnorm"),)
    budgets = token_budgets([0.1], DEEP_16X64_P, 512)
    with pytest.raises(ValueError, match="--reference 'layernorm' must be one of"):
        BudgetDesign(groups, "layernorm", budgets, {"rmsnorm": (1e-3,)}, 2)
    with pytest.raises(ValueError, match="without a learning-rate grid"):
        BudgetDesign(groups, "rmsnorm", budgets, {}, 2)


def test_budget_base_sets_the_steps_and_a_trajectory_point_at_the_early_step() -> None:
    budget = TokenBudget(0.35, 538, 27)
    spec = budget_base(BASE, budget)
    assert (spec.steps, spec.trajectory_every, spec.spike_window) == (538, 27, 32)
    assert budget_base(BASE, TokenBudget(0.015, 23, 10)).spike_window == 5


def test_the_design_round_trips_with_its_selections_found_per_budget() -> None:
    """Runs of two budgets share group, candidate, rate and seed: only their steps tell them apart."""
    design = _design()
    runs = []
    for budget in design.budgets[:2]:
        base = budget_base(BASE, budget)
        specs = selection_specs(design.group("bhyt"), (3e-3,), base)
        chosen = fake_result(specs[0], 4.0)
        design.selections[budget.label] = {"bhyt": Selection("bhyt", chosen, (chosen,))}
        evaluation = [
            fake_result(s, 4.1)
            for s in evaluation_specs(design.group("bhyt"), design.selections[budget.label]["bhyt"], (), 2, base)
        ]
        runs += [chosen, *evaluation]
    back = BudgetDesign.from_dict(design.to_dict(), runs)
    assert back.to_dict() == design.to_dict()
    first, second = back.budgets[:2]
    assert back.selection(first, "bhyt").chosen.spec.steps == 23
    assert back.selection(second, "bhyt").chosen.spec.steps == 66
    assert sorted(back.evaluation_runs(runs, second, "bhyt")) == [1, 2]
    assert {r.spec.steps for r in back.evaluation_runs(runs, second, "bhyt").values()} == {66}
    assert len(budget_runs(runs, first)) == 3

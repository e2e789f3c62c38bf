"""The study's protocol drivers: they decide which runs to train and when, hand them to a ``Scheduler`` and
collect the results, whichever launcher trains them.

- ``run_depth_study``: protocol v3 (``bhyt_pl.study.protocol.plan``), which plans as it goes: a group's grid extension
  once its selection runs are in, its evaluation seeds once it is selected, the matched arm once every group is;
- ``run_token_budget``: the token-budget map (``bhyt_pl.study.protocol.token_budget``): protocol v3's selection on
  every selected budget, each group's evaluation seeds on a budget as soon as its rate there is chosen;
- ``run_all``: a fixed list of runs (the stability sweep; the confirmation's run list).

Both hand every run to the scheduler through ``submit``, which first gives a run folder made before run labels
carried the step count its current name (``adopt_legacy_run``), so a folder of such runs is reused, not retrained.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from bhyt_pl.strict_json import loads, write
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.design import StudyDesign, check_disjoint
from bhyt_pl.study.protocol.plan import default_matched_lrs, evaluation_specs, select, selection_specs
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, legacy_label, run_dirname
from bhyt_pl.study.protocol.token_budget import BudgetDesign, budget_base

__all__ = ["adopt_legacy_run", "run_all", "run_depth_study", "run_token_budget", "submit"]

log = logging.getLogger(__name__)


def adopt_legacy_run(out: Path, spec: RunSpec) -> bool:
    """Rename the folder of ``spec``'s run when a study made it under its label without the step count
    (``plan.legacy_label``): ``out/runs/<old>/`` becomes ``out/runs/<new>/`` and its ``result.json`` takes the new
    label, so the scheduler reuses it as it reuses any finished run. Only a folder whose stored spec is ``spec``
    in every field but the label is renamed (never another run's, nor one with other settings), and never over a
    folder of the new name. Returns whether it renamed one."""
    old = legacy_label(spec)
    runs = out / "runs"
    old_dir, new_dir = runs / run_dirname(old), runs / run_dirname(spec.label)
    if old == spec.label or new_dir.exists() or not (old_dir / "result.json").is_file():
        return False
    try:
        stored = loads((old_dir / "result.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stored, dict) or stored.get("spec") != loads(
        json.dumps(asdict(replace(spec, label=old)), default=str)
    ):
        return False
    old_dir.rename(new_dir)
    stored["spec"]["label"] = spec.label
    old_logs = str(Path("runs") / run_dirname(old))
    if isinstance(stored.get("log_dir"), str) and stored["log_dir"].startswith(old_logs):
        stored["log_dir"] = str(Path("runs") / run_dirname(spec.label)) + stored["log_dir"][len(old_logs) :]
    write(new_dir / "result.json", stored)  # whole or absent: a stop here leaves the old result.json
    return True


def submit(scheduler: Scheduler, specs: Iterable[RunSpec]) -> list[RunSpec]:
    """``scheduler.submit(specs)``, after renaming the folders of those runs made under their legacy labels (when
    the scheduler resumes; ``--restart`` retrains every run anyway)."""
    specs = list(specs)
    if scheduler.resume:
        adopted = [spec.label for spec in specs if adopt_legacy_run(scheduler.out, spec)]
        if adopted:
            log.info(
                "study: %d run folder(s) made before run labels carried the step count renamed to their labels "
                "(e.g. %s) and reused",
                len(adopted),
                adopted[0],
            )
    return scheduler.submit(specs)


def _ignore(result: RunResult) -> None:
    pass


def run_all(
    specs: Sequence[RunSpec], scheduler: Scheduler, on_result: Callable[[RunResult], None] = _ignore
) -> list[RunResult]:
    """Train every spec once (finished ones are read back), calling ``on_result`` as each finishes; returns the
    results in the order of ``specs``."""
    submit(scheduler, specs)
    by_label: dict[str, RunResult] = {}
    for result in scheduler.finished():
        by_label[result.spec.label] = result
        on_result(result)
    return [by_label[label] for label in dict.fromkeys(spec.label for spec in specs) if label in by_label]


def run_depth_study(
    design: StudyDesign,
    base: RunSpec,
    scheduler: Scheduler,
    on_result: Callable[[RunResult], None] = _ignore,
    matched_lrs: Sequence[float] | None = None,
) -> list[RunResult]:
    """Protocol v3 (``bhyt_pl.study.protocol.plan``) over ``design``'s groups, grid and seeds: selection runs on the
    selection seed, a group's extension runs as soon as its selection finds its best rate at an edge, its
    best-rate evaluation seeds as soon as its selection is complete, and the matched arm (``matched_lrs``, else
    the default rule) once every group's is (runs of both arms train once). ``design``'s selections and matched
    rates are filled in place, so a report written meanwhile sees them."""
    groups, lrs = design.groups, design.lrs
    check_disjoint(groups)  # a candidate in two groups would share run labels and one group would never finish
    pending: dict[str, set[str]] = {}
    selection_runs: dict[str, list[RunResult]] = {g.label: [] for g in groups}
    by_label: dict[str, RunResult] = {}

    for g in groups:
        pending[g.label] = {s.label for s in submit(scheduler, selection_specs(g, lrs, base))}
    for result in scheduler.finished():
        by_label[result.spec.label] = result
        on_result(result)
        group = result.spec.group
        if result.spec.label not in pending.get(group, ()):
            continue
        selection_runs[group].append(result)
        pending[group].discard(result.spec.label)
        if pending[group]:
            continue
        step = select(design.group(group), selection_runs[group], lrs, design.extensions, base)
        if isinstance(step, RunSpec):  # the best rate sits at an edge: one more grid step for its candidate
            pending[group] = {s.label for s in submit(scheduler, [step])}
            continue
        design.selections[group] = step
        submit(scheduler, evaluation_specs(design.group(group), step, (), design.n_seeds, base))
        if design.complete:  # every group selected: the matched arm
            ordered = [design.selections[g.label] for g in groups]
            if matched_lrs is not None:
                design.matched_lrs = tuple(sorted(matched_lrs))
                design.matched_note = "given with --matched-lrs"
            else:
                design.matched_lrs = default_matched_lrs(ordered, lrs)
                design.matched_note = (
                    "the two highest --lrs rates at which every group's kept candidate trained on the selection seed"
                    + ("" if len(design.matched_lrs) == 2 else f" (only {len(design.matched_lrs)} qualified)")
                )
            for g in groups:
                specs = evaluation_specs(g, design.selections[g.label], design.matched_lrs, design.n_seeds, base)
                submit(scheduler, specs)
    group_order = {g.label: i for i, g in enumerate(groups)}
    return sorted(
        by_label.values(),
        key=lambda r: (group_order[r.spec.group], r.spec.seed_index, r.spec.candidate, r.spec.lr),
    )


def run_token_budget(
    design: BudgetDesign, base: RunSpec, scheduler: Scheduler, on_result: Callable[[RunResult], None] = _ignore
) -> list[RunResult]:
    """The token-budget map: on every budget that selects (``design.selected_budgets``), each group's selection runs
    on the selection seed over its own grid (``plan.select``, with its extensions); as soon as a group's rate on a
    budget is chosen, its evaluation seeds there at that rate, and on every budget that inherits from it at the same
    rate. Selection runs are handed over from the largest budget down, so the longest runs start first.
    ``design.selections`` is filled in place, so a report written meanwhile sees what is chosen so far."""
    by_steps = {b.steps: b for b in design.budgets}
    heirs = [b for b in design.budgets if b not in design.selected_budgets]
    pending: dict[tuple[str, str], set[str]] = {}
    selection_runs: dict[tuple[str, str], list[RunResult]] = {}
    by_label: dict[str, RunResult] = {}
    for budget in reversed(design.selected_budgets):
        budget_spec = budget_base(base, budget)
        for g in design.groups:
            specs = selection_specs(g, design.grids[g.label], budget_spec)
            pending[(budget.label, g.label)] = {s.label for s in submit(scheduler, specs)}
            selection_runs[(budget.label, g.label)] = []
    for result in scheduler.finished():
        by_label[result.spec.label] = result
        on_result(result)
        budget = by_steps.get(result.spec.steps)
        key = (budget.label if budget is not None else "", result.spec.group)
        if budget is None or result.spec.label not in pending.get(key, ()):
            continue
        selection_runs[key].append(result)
        pending[key].discard(result.spec.label)
        if pending[key]:
            continue
        group, budget_spec = design.group(result.spec.group), budget_base(base, budget)
        step = select(group, selection_runs[key], design.grids[group.label], design.extensions, budget_spec)
        if isinstance(step, RunSpec):  # the best rate sits at an edge: one more grid step
            pending[key] = {s.label for s in submit(scheduler, [step])}
            continue
        design.selections.setdefault(budget.label, {})[group.label] = step
        takers = [budget] + (heirs if budget == design.selected_budgets[-1] else [])
        for taker in takers:
            submit(scheduler, evaluation_specs(group, step, (), design.n_seeds, budget_base(base, taker)))
    budget_order = {b.steps: i for i, b in enumerate(design.budgets)}
    group_order = {g.label: i for i, g in enumerate(design.groups)}
    return sorted(
        by_label.values(),
        key=lambda r: (
            budget_order.get(r.spec.steps, len(budget_order)),
            group_order.get(r.spec.group, len(group_order)),
            r.spec.seed_index,
            r.spec.candidate,
            r.spec.lr,
        ),
    )

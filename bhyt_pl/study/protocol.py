"""The study's protocol drivers: they decide which runs to train and when, hand them to a ``Scheduler`` and
collect the results, whichever launcher trains them.

- ``run_depth_study``: protocol v3 (``bhyt_pl.study.plan``), which plans as it goes: a group's grid extension
  once its selection runs are in, its evaluation seeds once it is selected, the matched arm once every group is;
- ``run_all``: a fixed list of runs (the stability sweep; a later stage's own run list).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bhyt_pl.study.design import StudyDesign, check_disjoint
from bhyt_pl.study.plan import default_matched_lrs, evaluation_specs, select, selection_specs
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.study.scheduler import Scheduler

__all__ = ["run_all", "run_depth_study"]


def _ignore(result: RunResult) -> None:
    pass


def run_all(
    specs: Sequence[RunSpec], scheduler: Scheduler, on_result: Callable[[RunResult], None] = _ignore
) -> list[RunResult]:
    """Train every spec once (finished ones are read back), calling ``on_result`` as each finishes; returns the
    results in the order of ``specs``."""
    scheduler.submit(specs)
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
    """Protocol v3 (``bhyt_pl.study.plan``) over ``design``'s groups, grid and seeds: selection runs on the
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
        pending[g.label] = {s.label for s in scheduler.submit(selection_specs(g, lrs, base))}
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
            pending[group] = {s.label for s in scheduler.submit([step])}
            continue
        design.selections[group] = step
        scheduler.submit(evaluation_specs(design.group(group), step, (), design.n_seeds, base))
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
                scheduler.submit(specs)
    group_order = {g.label: i for i, g in enumerate(groups)}
    return sorted(
        by_label.values(),
        key=lambda r: (group_order[r.spec.group], r.spec.seed_index, r.spec.candidate, r.spec.lr),
    )

"""What a study runs: the learning-rate protocol's rules and the run lists of both modes, for the scheme groups
of ``bhyt_pl.study.protocol.design`` (a ``--schemes`` entry, possibly a grid of candidates; the protocol picks one per
group).

Depth study protocol v3 (docs/depth_study.md): selection and evaluation use different seeds.

1. Selection, on the selection seed (index 0) only: every candidate of every group trains at every
   learning rate of ``--lrs``; the group keeps the (candidate, learning rate) with the lowest validation
   loss (diverged or failed runs: infinite; ties keep the earlier candidate and the lower rate).
2. No best rate on the grid's edge: when the kept rate is the lowest (highest) its candidate tried, the
   candidate trains one grid step (the grid's ratio at that end) further down (up), up to ``extensions``
   times; a group still at an edge afterwards is flagged (``Selection.edge``).
3. Evaluation, on seeds ``1 .. n_seeds`` (never the selection seed): the kept candidate at its best rate
   (the "best" arm) and at every matched rate (the "matched" arm; default: the two highest ``--lrs``
   rates at which every group's kept candidate trained on the selection seed). A run of both arms is
   trained once (the same spec).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from bhyt_pl.study.protocol.design import SchemeGroup, Selection, rate_key
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, RunStatus, run_label
from bhyt_pl.variants import Variant

__all__ = [
    "SELECTION_SEED",
    "choose",
    "default_matched_lrs",
    "evaluation_seeds",
    "evaluation_specs",
    "extension_lr",
    "select",
    "selection_specs",
    "sweep_specs",
]

SELECTION_SEED = 0
"""Seed index of the selection runs; evaluation seeds are ``1 .. n`` (``evaluation_seeds``)."""


def _spec(
    base: RunSpec, group: SchemeGroup, variant: Variant, lr: float, seed_index: int, reported: bool = False
) -> RunSpec:
    """``base`` for one run; ``base``'s stability and layer-importance measurements are kept only when the run
    is ``reported`` (an evaluation seed at the group's best rate: the only runs whose tables show them)."""
    return replace(
        base,
        stability_every=base.stability_every if reported else 0,
        importance=base.importance and reported,
        label=run_label(variant.label, lr, base.steps, seed_index),
        group=group.label,
        candidate=variant.label,
        seed_index=seed_index,
        norm=variant.norm,
        norm_args=dict(variant.norm_args),
        lr=float(lr),
        seed=base.seed + seed_index,
        data_seed=base.data_seed + seed_index,
    )


def evaluation_seeds(n_seeds: int) -> range:
    """The evaluation seed indices ``1 .. n_seeds``: the selection seed is never one of them."""
    return range(SELECTION_SEED + 1, SELECTION_SEED + 1 + n_seeds)


def selection_specs(group: SchemeGroup, lrs: Sequence[float], base: RunSpec) -> list[RunSpec]:
    """Step 1 of the protocol: every candidate at every learning rate, on the selection seed."""
    return [_spec(base, group, v, lr, SELECTION_SEED) for v in group.candidates for lr in lrs]


def _loss(r: RunResult) -> float:
    return r.val_loss if r.status == RunStatus.OK and math.isfinite(r.val_loss) else math.inf


def choose(results: Sequence[RunResult]) -> RunResult:
    """The selection run with the lowest validation loss (diverged and failed runs: infinite; ties: the
    earlier candidate, then the lower learning rate)."""
    if not results:
        raise ValueError("no selection runs to choose from")
    order = {}
    for r in results:
        order.setdefault(r.spec.candidate, len(order))
    return min(results, key=lambda r: (_loss(r), order[r.spec.candidate], r.spec.lr))


def extension_lr(lr: float, tried: Sequence[float], grid: Sequence[float]) -> float | None:
    """The rate one grid step beyond ``lr`` when it is the lowest or highest of ``tried`` (its candidate's rates),
    else None. The step is the grid's ratio at that end (``grid[1] / grid[0]`` below, ``grid[-1] / grid[-2]``
    above); a one-rate grid has no ratio, so no extension (the group stays flagged)."""
    rates, ordered = sorted(set(tried)), sorted(grid)
    if len(ordered) < 2 or lr not in rates:
        return None
    if lr == rates[0]:
        return float(f"{lr / (ordered[1] / ordered[0]):.6g}")  # 6 digits: a stable label (lr0.000333333)
    if lr == rates[-1]:
        return float(f"{lr * (ordered[-1] / ordered[-2]):.6g}")
    return None


def select(
    group: SchemeGroup, runs: Sequence[RunResult], grid: Sequence[float], limit: int, base: RunSpec
) -> Selection | RunSpec:
    """Steps 1-2 for one group from its finished selection runs: the ``Selection`` when it is complete, or the
    next extension run to train (the kept rate sits at an edge and fewer than ``limit`` extensions ran). The runs
    are kept in the group's candidate order, then by rate: the design a study records does not depend on which run
    finished first (a process pool finishes them in any order)."""
    order = {v.label: i for i, v in enumerate(group.candidates)}
    runs = sorted(runs, key=lambda r: (order.get(r.spec.candidate, len(order)), r.spec.lr))
    grid_rates = {rate_key(lr) for lr in grid}
    extensions = tuple(sorted({r.spec.lr for r in runs if rate_key(r.spec.lr) not in grid_rates}, key=lambda lr: -lr))
    best = choose(runs)
    if _loss(best) == math.inf:
        return Selection(group.label, None, tuple(runs), extensions)
    tried = sorted({r.spec.lr for r in runs if r.spec.candidate == best.spec.candidate})
    step = extension_lr(best.spec.lr, tried, grid)
    if step is not None and len(extensions) < limit:
        return _spec(base, group, group.candidate(best.spec.candidate), step, SELECTION_SEED)
    edge = ""
    if len(tried) < 2 or best.spec.lr == tried[0]:
        edge = "lowest" if len(tried) >= 2 else "single rate"
    elif best.spec.lr == tried[-1]:
        edge = "highest"
    return Selection(group.label, best, tuple(runs), extensions, edge)


def default_matched_lrs(selections: Sequence[Selection], grid: Sequence[float], count: int = 2) -> tuple[float, ...]:
    """The ``count`` highest grid rates at which every group's kept candidate trained (status ok) on the
    selection seed; fewer when fewer qualify (none when a group has no kept candidate)."""
    qualifying = []
    for lr in sorted(grid, reverse=True):
        ok = True
        for s in selections:
            run = next(
                (
                    r
                    for r in s.runs
                    if s.chosen is not None and r.spec.candidate == s.candidate and rate_key(r.spec.lr) == rate_key(lr)
                ),
                None,
            )
            ok = ok and run is not None and run.status == RunStatus.OK and math.isfinite(run.val_loss)
        if ok:
            qualifying.append(lr)
        if len(qualifying) == count:
            break
    return tuple(sorted(qualifying))


def evaluation_specs(
    group: SchemeGroup, selection: Selection, matched_lrs: Sequence[float], n_seeds: int, base: RunSpec
) -> list[RunSpec]:
    """Step 3: the kept candidate on every evaluation seed at the best rate and at each matched rate; a rate of
    both arms appears once (the runs coincide). Only the best-rate runs keep ``base``'s stability and
    layer-importance measurements (the group table and the importance table report those runs only)."""
    if selection.chosen is None:
        return []
    variant = group.candidate(selection.candidate)
    rates: dict[str, float] = {}  # by rate key: a matched rate equal to the best one is trained once
    for lr in (selection.lr, *matched_lrs):
        rates.setdefault(rate_key(lr), lr)
    best = rate_key(selection.lr)
    return [
        _spec(base, group, variant, lr, i, reported=key == best)
        for key, lr in rates.items()
        for i in evaluation_seeds(n_seeds)
    ]


def sweep_specs(
    groups: Sequence[SchemeGroup], depths: Sequence[int], lrs: Sequence[float], n_seeds: int, base: RunSpec
) -> list[RunSpec]:
    """The stability sweep: every (candidate, depth, learning rate, seed), labelled
    ``<candidate>@L<depth>-lr<lr>-steps<steps>-s<seed>``; ordered by depth, then learning rate, then seed, then scheme,
    so an interrupted sweep has compared every scheme at the shallow end."""
    specs = []
    for depth in depths:
        for lr in lrs:
            for seed_index in range(n_seeds):
                for group in groups:
                    for v in group.candidates:
                        spec = _spec(base, group, v, lr, seed_index)
                        specs.append(
                            replace(
                                spec,
                                label=f"{v.label}@L{depth}-lr{lr:g}-steps{base.steps}-s{seed_index}",
                                overrides={**base.overrides, "n_layers": int(depth)},
                            )
                        )
    return specs

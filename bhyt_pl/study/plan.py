"""What a study runs: scheme groups (a ``--schemes`` entry, possibly a grid), the learning-rate protocol and
the run lists of both modes.

A ``--schemes`` entry is ``name[:key=value,...]``; a value written ``v1|v2|...`` is a grid over that
option (several grid options: every combination), e.g. ``dyt:alpha_attn=0.5|1.0|2.0``. Every grid
point is a candidate; the protocol picks one per group.

Depth study protocol (the paper's: each method's best learning rate from a shared grid, sized down):

1. on the first seed, every candidate of every group trains at every learning rate of ``--lrs``;
2. each group keeps the (candidate, learning rate) with the lowest validation loss (diverged or failed
   runs count as infinite loss; ties keep the earlier candidate and the lower learning rate);
3. the remaining seeds train that choice; every statistic of the group is reported there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.variants import Variant, parse_variant, split_options

__all__ = ["SchemeGroup", "choose", "parse_group", "run_label", "seed_specs", "selection_specs", "sweep_specs"]


@dataclass(frozen=True)
class SchemeGroup:
    """One ``--schemes`` entry: its text (the label of every table row) and its grid candidates."""

    label: str
    norm: str
    candidates: tuple[Variant, ...]


def parse_group(text: str) -> SchemeGroup:
    """``"dyt:alpha_attn=0.5|1.0,bias=True"`` -> a group with two candidates; each is built once to validate it."""
    name, _, rest = text.partition(":")
    options = [item for item in split_options(rest) if item]
    choices = []
    for item in options:
        key, eq, value = item.partition("=")
        if not eq:
            parse_variant(text)  # raises the scheme parser's error naming the option
        choices.append([f"{key}={v}" for v in value.split("|")])
    candidates = []
    for combo in itertools.product(*choices):
        variant = parse_variant(name + (":" + ",".join(combo) if combo else ""))
        candidates.append(variant)
    return SchemeGroup(text, candidates[0].norm, tuple(candidates))


def run_label(variant: Variant, lr: float, seed_index: int) -> str:
    """``<candidate>@lr<lr>-s<seed index>``: unique within a study and stable across re-runs (resume)."""
    return f"{variant.label}@lr{lr:g}-s{seed_index}"


def _spec(base: RunSpec, group: SchemeGroup, variant: Variant, lr: float, seed_index: int) -> RunSpec:
    return replace(
        base,
        label=run_label(variant, lr, seed_index),
        group=group.label,
        norm=variant.norm,
        norm_args=dict(variant.norm_args),
        lr=float(lr),
        seed=base.seed + seed_index,
        data_seed=base.data_seed + seed_index,
    )


def selection_specs(group: SchemeGroup, lrs: Sequence[float], base: RunSpec) -> list[RunSpec]:
    """Step 1 of the protocol: every candidate at every learning rate, on the first seed."""
    return [_spec(base, group, v, lr, 0) for v in group.candidates for lr in lrs]


def choose(results: Sequence[RunResult]) -> RunResult:
    """Step 2: the first-seed run with the lowest validation loss (diverged and failed runs: infinite)."""
    if not results:
        raise ValueError("no first-seed runs to choose from")

    def key(item: tuple[int, RunResult]) -> tuple[float, int]:
        i, r = item
        loss = r.val_loss if r.status == "ok" and math.isfinite(r.val_loss) else math.inf
        return loss, i

    return min(enumerate(results), key=key)[1]


def seed_specs(group: SchemeGroup, chosen: RunResult, n_seeds: int, base: RunSpec) -> list[RunSpec]:
    """Step 3: seeds ``1 .. n_seeds-1`` at the chosen candidate and learning rate."""
    variant = next(v for v in group.candidates if v.norm == chosen.spec.norm and v.norm_args == chosen.spec.norm_args)
    return [_spec(base, group, variant, chosen.spec.lr, i) for i in range(1, n_seeds)]


def sweep_specs(
    groups: Sequence[SchemeGroup], depths: Sequence[int], lrs: Sequence[float], n_seeds: int, base: RunSpec
) -> list[RunSpec]:
    """The stability sweep: every (candidate, depth, learning rate, seed), labelled
    ``<candidate>@L<depth>-lr<lr>-s<seed>``; ordered by depth, then learning rate, then seed, then scheme,
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
                                label=f"{v.label}@L{depth}-lr{lr:g}-s{seed_index}",
                                overrides={**base.overrides, "n_layers": int(depth)},
                            )
                        )
    return specs

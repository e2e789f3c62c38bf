"""The run lists of the two study modes: the depth study (every scheme once, same budget) and the
stability sweep (schemes x depths x learning rates, like DyT's stability grid)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bhyt_pl.bench.variants import Variant
from bhyt_pl.study.runner import RunSpec

__all__ = ["depth_study_specs", "sweep_specs"]


def depth_study_specs(variants: Sequence[Variant], base: RunSpec) -> list[RunSpec]:
    """One run per scheme, everything else from ``base`` (same seed, data, budget, learning rate)."""
    return [replace(base, label=v.label, norm=v.norm, norm_args=dict(v.norm_args)) for v in variants]


def sweep_specs(
    variants: Sequence[Variant], depths: Sequence[int], lrs: Sequence[float], base: RunSpec
) -> list[RunSpec]:
    """Every (scheme, depth, learning rate), labelled ``<scheme>@L<depth>-lr<lr>``; ordered by depth, then
    learning rate, then scheme, so an interrupted sweep has compared every scheme at the shallow end."""
    specs = []
    for depth in depths:
        for lr in lrs:
            for v in variants:
                specs.append(
                    replace(
                        base,
                        label=f"{v.label}@L{depth}-lr{lr:g}",
                        norm=v.norm,
                        norm_args=dict(v.norm_args),
                        overrides={**base.overrides, "n_layers": int(depth)},
                        lr=float(lr),
                    )
                )
    return specs

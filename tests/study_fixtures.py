"""Study values built by hand for tests: runs with set losses and depth profiles, a design whose groups kept the
given candidates and rates, and a two-group result set whose claims are worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bhyt_pl.study.design import SchemeGroup, Selection, StudyDesign
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.variants import Variant

BASE = RunSpec(label="base", norm="rmsnorm", seed=42, data_seed=42)


def profile_stats(magnitude: Sequence[float], variance: Sequence[float]) -> dict[str, float]:
    """Flat per-layer statistics as ``DepthStatsCollector`` writes them; the median token is half the mean."""
    out = {f"magnitude/layer_{i:02d}": v for i, v in enumerate(magnitude)}
    out.update({f"variance/layer_{i:02d}": v for i, v in enumerate(variance)})
    out.update({f"median_magnitude/layer_{i:02d}": v / 2 for i, v in enumerate(magnitude)})
    return out


def _point(step: int, magnitude: list[float], variance: list[float], val_loss: float) -> dict:
    return {"step": step, "magnitude": magnitude, "variance": variance, "val_loss": val_loss}


def fake_result(spec: RunSpec, loss: float, magnitude: list[float] | None = None, status: str = "ok") -> RunResult:
    """A finished run: validation loss ``loss``, last-layer profile ``magnitude`` (variance its square), a
    trajectory of two points (step 0 all ones, step 10 the end)."""
    magnitude = magnitude or [1.0, 2.0, 3.0, 4.0]
    variance = [m * m for m in magnitude]
    trajectory = [_point(0, [1.0] * len(magnitude), [1.0] * len(magnitude), 10.0)]
    trajectory.append(_point(10, magnitude, variance, loss))
    return RunResult(
        spec=spec,
        status=status,
        n_layers=len(magnitude),
        dim=16,
        steps_done=10,
        val_loss=loss if status == "ok" else math.nan,
        depth_final=profile_stats(magnitude, variance),
        trajectory=trajectory,
    )


def kept_design(
    best: Mapping[str, float],
    matched_lrs: Sequence[float] = (),
    candidates: Mapping[str, str] | None = None,
    edges: Mapping[str, str] | None = None,
) -> StudyDesign:
    """A finished selection: group ``g`` kept candidate ``candidates.get(g, g)`` at rate ``best[g]``, flagged at
    ``edges.get(g)`` (its one selection run carries no measurement; the claims and tables read the evaluation
    runs)."""
    groups, selections = [], {}
    for group, lr in best.items():
        candidate = (candidates or {}).get(group, group)
        groups.append(SchemeGroup(group, "rmsnorm", (Variant(candidate, "rmsnorm"),)))
        spec = RunSpec(label=f"{candidate}@lr{lr:g}-s0", norm="rmsnorm", group=group, candidate=candidate, lr=lr)
        chosen = RunResult(spec)
        selections[group] = Selection(group, chosen, (chosen,), edge=(edges or {}).get(group, ""))
    return StudyDesign(tuple(groups), selections=selections, matched_lrs=tuple(matched_lrs))


def synthetic(group: str, lr: float, seed_index: int, magnitude: list[float], loss: float) -> RunResult:
    spec = replace(
        BASE,
        label=f"{group}@lr{lr:g}-s{seed_index}",
        group=group,
        candidate=group,
        lr=lr,
        seed_index=seed_index,
        norm=group,
    )
    return fake_result(spec, loss, magnitude)


def synthetic_set() -> tuple[list[RunResult], StudyDesign]:
    """Two groups, 3 evaluation seeds, best rates 1e-3 (a) and 3e-3 (b), matched rates 3e-3 and 1e-2.
    Group a's last-layer magnitude is e^-1 of b's at 3e-3 and e^+0.5 at 1e-2 (seed offsets 0, 0.1, -0.1)."""
    results = []
    for i, offset in zip((1, 2, 3), (0.0, 0.1, -0.1), strict=True):
        b = 4.0 * math.exp(offset)
        results.append(synthetic("b", 3e-3, i, [1.0, 2.0, 3.0, b], 3.0 + offset))
        results.append(synthetic("b", 1e-2, i, [1.0, 2.0, 3.0, b], 3.2 + offset))
        results.append(synthetic("a", 3e-3, i, [1.0, 1.0, 1.0, b * math.exp(-1 + offset / 2)], 3.5))
        results.append(synthetic("a", 1e-2, i, [1.0, 1.0, 1.0, b * math.exp(0.5 + offset / 2)], 3.5))
        results.append(synthetic("a", 1e-3, i, [1.0, 1.0, 1.0, 1.0], 2.9 + offset + 0.01 * i))
    return results, kept_design({"a": 1e-3, "b": 3e-3}, (3e-3, 1e-2))

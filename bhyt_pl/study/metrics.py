"""Per-run scalars the study compares, read from one snapshot of a run (its end, or one trajectory point).

A snapshot is a ``trajectory_point`` record (``bhyt_pl.study.runner``): ``step``, ``val_loss`` and per-layer
lists (``magnitude``, ``variance``, ``median_magnitude``, ...) measured on the study's fixed validation
batches. Depth-wise growth (docs/method.md, section 10) is read from layer ``q = max(1, L // 4)`` (1-based)
to the last layer ``L``: ``growth = ln(value_L / value_q)`` and the least-squares slope of ``ln value``
against the layer index over ``q .. L``; both skip the first blocks, which write the residual stream's
outliers, and both are 0 for a profile that stays flat after them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from bhyt_pl.study.measure import log_slope, trajectory_point
from bhyt_pl.study.runner import RunResult

__all__ = ["LOG_METRICS", "METRICS", "final_snapshot", "growth", "growth_slope", "quarter_layer", "snapshots", "value"]


def quarter_layer(n_layers: int) -> int:
    """The 1-based layer growth is measured from: ``L // 4`` (at least 1)."""
    return max(1, n_layers // 4)


def growth(values: Sequence[float]) -> float:
    """``ln(values[L-1] / values[q-1])`` with ``q = quarter_layer(L)``: NaN unless both are finite and > 0."""
    if not values:
        return math.nan
    first, last = values[quarter_layer(len(values)) - 1], values[-1]
    if not (first > 0 and last > 0 and math.isfinite(first) and math.isfinite(last)):
        return math.nan
    return math.log(last / first)


def growth_slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``ln value`` against the layer index over layers ``q .. L`` (per layer)."""
    return log_slope(list(values), first_layer=quarter_layer(len(values))) if values else math.nan


def _last(values: Sequence[float] | None) -> float:
    return values[-1] if values else math.nan


METRICS: dict[str, tuple[str, Callable[[dict[str, Any], int], float]]] = {
    "val_loss": ("validation loss (nats)", lambda s, d: s.get("val_loss", math.nan)),
    "magnitude": ("last-layer mean-token magnitude", lambda s, d: _last(s.get("magnitude"))),
    "median_magnitude": ("last-layer median-token magnitude", lambda s, d: _last(s.get("median_magnitude"))),
    "magnitude_per_coordinate": (
        "last-layer mean-token magnitude / sqrt(d)",
        lambda s, d: _last(s.get("magnitude")) / math.sqrt(d) if d > 0 else math.nan,
    ),
    "variance": ("last-layer variance", lambda s, d: _last(s.get("variance"))),
    "magnitude_growth": ("ln(magnitude at L / at L/4)", lambda s, d: growth(s.get("magnitude", []))),
    "variance_growth": ("ln(variance at L / at L/4)", lambda s, d: growth(s.get("variance", []))),
    "magnitude_growth_slope": (
        "slope of ln magnitude over layers L/4..L",
        lambda s, d: growth_slope(s.get("magnitude", [])),
    ),
    "variance_growth_slope": (
        "slope of ln variance over layers L/4..L",
        lambda s, d: growth_slope(s.get("variance", [])),
    ),
}
"""``name -> (description, fn(snapshot, model width) -> value)``."""

LOG_METRICS = frozenset({"magnitude", "median_magnitude", "magnitude_per_coordinate", "variance"})
"""Compared between runs as ``ln(a) - ln(b)`` (ratios: they span orders of magnitude across schemes)."""


def final_snapshot(r: RunResult) -> dict[str, Any]:
    """The end-of-training snapshot (the run's final depth statistics and validation loss)."""
    point = trajectory_point(r.steps_done, r.depth_final)
    point["val_loss"] = r.val_loss
    return point


def snapshots(r: RunResult) -> dict[int, dict[str, Any]]:
    """``{step: snapshot}`` over training (``r.trajectory``); empty for a run that did not finish ok."""
    if r.status != "ok":
        return {}
    return {int(p["step"]): p for p in r.trajectory}


def value(r: RunResult, metric: str, snapshot: dict[str, Any] | None = None) -> float:
    """``metric`` of run ``r`` at ``snapshot`` (default: its end), on the comparison scale (ln for
    ``LOG_METRICS``); NaN for a run that diverged or failed."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if r.status != "ok":
        return math.nan
    x = METRICS[metric][1](final_snapshot(r) if snapshot is None else snapshot, r.dim)
    if metric in LOG_METRICS:
        return math.log(x) if x is not None and math.isfinite(x) and x > 0 else math.nan
    return x if x is not None else math.nan

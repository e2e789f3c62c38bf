"""Per-run scalars the study compares, read from one snapshot of a run (its end, or one trajectory point).

A snapshot is a ``trajectory_point`` record: ``step``, ``val_loss`` and the per-layer
profile of every statistic recorded along training (``magnitude``, ``variance``, ``median_magnitude``, ...)
measured on the study's fixed validation batches. The metrics are the validation loss and every summary of every
per-layer statistic declared in ``bhyt_pl.callbacks.layer_stats`` (``magnitude``, ``magnitude_growth``,
``variance_growth_slope``, ...), read from the registry when asked: a statistic registered later has its metrics
at once. Depth-wise growth (docs/method.md, section 10) is read from layer ``q = max(1, L // 4)`` (1-based) to
the last layer ``L``.

Margins (docs/method.md, section 10 says why): nats for the loss, 0.02 (below most published gaps between
schemes); each statistic's summaries declare their own (ln units for last-layer values and growth).

Every metric is read at one of three *phases* of a run (``PHASES``, ``phase_value``), each paired per seed on the
metric's own comparison scale: at initialisation (the step-0 snapshot), at the end, and made by training (end minus
step 0: for a ``log`` metric the ln of the end / step-0 ratio). The validation loss has a step-0 value too (the
untrained model's loss on the same batches) and is read the same way: its made-by-training value is the loss the
training removed, negative when training helped. ``phase_differences`` pairs two groups' runs at all three phases,
and ``effect_origin`` says in words where an end effect comes from (``ORIGINS``: "present at initialisation", "made
by training", ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bhyt_pl.callbacks.layer_stats import LayerStatistic, Summary, layer_profile, statistics
from bhyt_pl.study.protocol.spec import RunResult, RunStatus, TrajectoryPoint
from bhyt_pl.study.protocol.stats import Interval, interval, paired_differences

__all__ = [
    "END",
    "GROWS",
    "MADE_BY_TRAINING",
    "NOT_RESOLVED",
    "ORIGINS",
    "PRESENT_AT_INIT",
    "PRESENT_AT_INIT_ONLY",
    "REVERSED",
    "SHRINKS",
    "TOO_FEW_PAIRS",
    "PHASES",
    "PHASE_NAMES",
    "VAL_LOSS",
    "Metric",
    "PhaseDifferences",
    "effect_origin",
    "final_snapshot",
    "metric",
    "metrics",
    "paired_at_phase",
    "paired_over_training",
    "phase_differences",
    "phase_value",
    "snapshots",
    "trajectory_point",
    "trajectory_statistics",
    "value",
]

Snapshot = Mapping[str, float | list[float]]
"""A trajectory point or the end-of-training snapshot, as a metric reads it (``TrajectoryPoint``)."""


def trajectory_statistics() -> tuple[LayerStatistic, ...]:
    """The registered statistics a trajectory point records (declared ``trajectory=True``)."""
    return tuple(s for s in statistics() if s.trajectory)


def trajectory_point(step: int, stats: Mapping[str, float]) -> TrajectoryPoint:
    """The compact record of one trajectory point: the profile of every statistic recorded along training (one
    value per layer; a statistic of several sites of a layer: their mean), its ``step`` and ``val_loss``."""
    point: TrajectoryPoint = {"step": step}
    for stat in trajectory_statistics():
        point[stat.name] = layer_profile(stats, stat.name)
    point["val_loss"] = stats.get("val_loss", math.nan)
    return point


_DESCRIPTIONS = {
    "last": "last-layer {name} ({unit})",
    "growth": "ln({name} at L / at L/4)",
    "growth_slope": "slope of ln {name} over layers L/4..L",
    "slope": "slope of ln {name} over layers 2..L",
    "layer_mean": "{name}, mean over layers ({unit})",
}


@dataclass(frozen=True)
class Metric:
    """One per-run scalar.

    Args:
        name: its name in claims and ``results.json``.
        description: what it is.
        read: ``(snapshot, model width) -> value`` on its own scale.
        log: compared between runs as ``ln(a) - ln(b)`` (a ratio spanning orders of magnitude).
        margin: equivalence / non-inferiority margin on its comparison scale; None: no such claim on it.
        statistic, summary: the per-layer statistic and summary it comes from (None for the validation loss).
    """

    name: str
    description: str
    read: Callable[[Snapshot, int], float]
    log: bool = False
    margin: float | None = None
    statistic: LayerStatistic | None = None
    summary: Summary | None = None


VAL_LOSS = Metric("val_loss", "validation loss (nats)", lambda s, d: s.get("val_loss", math.nan), margin=0.02)


def _summary_metric(stat: LayerStatistic, summary: Summary) -> Metric:
    return Metric(
        summary.metric(stat.name),
        _DESCRIPTIONS[summary.kind].format(name=stat.name.replace("_", " "), unit=stat.unit),
        lambda s, d: summary.value(stat.profile(s, d)),
        summary.log,
        summary.margin,
        stat,
        summary,
    )


def metrics() -> dict[str, Metric]:
    """Every metric, by name: the validation loss, then each registered statistic's summaries in order."""
    out = {VAL_LOSS.name: VAL_LOSS}
    for stat in statistics():
        for summary in stat.summaries:
            out[summary.metric(stat.name)] = _summary_metric(stat, summary)
    return out


def metric(name: str) -> Metric:
    """The metric called ``name`` (``ValueError`` listing every metric otherwise)."""
    known = metrics()
    if name not in known:
        raise ValueError(f"metric must be one of {sorted(known)}, got {name!r}")
    return known[name]


def final_snapshot(r: RunResult) -> TrajectoryPoint:
    """The end-of-training snapshot (the run's final depth statistics and validation loss)."""
    point = trajectory_point(r.steps_done, r.depth_final)
    point["val_loss"] = r.val_loss
    return point


def snapshots(r: RunResult) -> dict[int, TrajectoryPoint]:
    """``{step: snapshot}`` over training (``r.trajectory``); empty for a run that did not finish ok."""
    if r.status != RunStatus.OK:
        return {}
    return {int(p["step"]): p for p in r.trajectory}


def value(r: RunResult, name: str, snapshot: Snapshot | None = None, compare: bool = True) -> float:
    """Metric ``name`` of run ``r`` at ``snapshot`` (default: its end), on the comparison scale (ln for a ``log``
    metric) unless ``compare`` is False; NaN for a run that diverged or failed."""
    m = metric(name)
    if r.status != RunStatus.OK:
        return math.nan
    x = m.read(final_snapshot(r) if snapshot is None else snapshot, r.dim)
    if x is None:
        return math.nan
    if m.log and compare:
        return math.log(x) if math.isfinite(x) and x > 0 else math.nan
    return x


END = "end"
PHASE_NAMES = {"init": "at initialisation", END: "at the end", "training": "made by training"}
"""Each phase of a run a metric is read at (``phase_value``), with the words a test's name shows it by."""
PHASES = tuple(PHASE_NAMES)


def phase_value(r: RunResult, name: str, phase: str = END) -> float:
    """Metric ``name`` of run ``r`` on its comparison scale at ``phase``: ``init`` the step-0 snapshot's value,
    ``end`` the end's (``value``), ``training`` the end's minus step 0's. NaN for a run that diverged or failed, and
    for ``init`` and ``training`` when the run has no step-0 snapshot."""
    if phase not in PHASE_NAMES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if phase == END:
        return value(r, name)
    start = snapshots(r).get(0)
    init = math.nan if start is None else value(r, name, start)
    return init if phase == "init" else value(r, name) - init


def paired_over_training(
    a: Mapping[int, RunResult], b: Mapping[int, RunResult], name: str
) -> list[tuple[int, list[float]]]:
    """``(step, per-seed differences a - b of metric name)`` at every step some run of each side recorded, paired on
    the seeds with a snapshot at that step on both sides (``a`` and ``b``: runs by seed index). ``snapshots`` is
    empty for a diverged or failed run, so such a run loses only its own pair, never the step."""
    traj_a = {i: snapshots(r) for i, r in a.items()}
    traj_b = {i: snapshots(r) for i, r in b.items()}
    steps = sorted(set().union(*traj_a.values()) & set().union(*traj_b.values()))
    out = []
    for step in steps:
        seeds = sorted(i for i in set(traj_a) & set(traj_b) if step in traj_a[i] and step in traj_b[i])
        out.append(
            (
                step,
                paired_differences(
                    {i: value(a[i], name, traj_a[i][step]) for i in seeds},
                    {i: value(b[i], name, traj_b[i][step]) for i in seeds},
                ),
            )
        )
    return out


def paired_at_phase(a: Mapping[int, RunResult], b: Mapping[int, RunResult], name: str, phase: str = END) -> list[float]:
    """The per-seed differences ``a - b`` of metric ``name`` at ``phase`` (``phase_value``), on the seeds both sides
    have a finite value for (``a`` and ``b``: runs by seed index); a diverged or failed run loses only its pair."""
    return paired_differences(
        {i: phase_value(r, name, phase) for i, r in a.items()},
        {i: phase_value(r, name, phase) for i, r in b.items()},
    )


@dataclass(frozen=True)
class PhaseDifferences:
    """One comparison's paired difference at each phase, each a 95 % t-interval over its own pairs.

    Args:
        init: at initialisation (step 0).
        end: at the end.
        training: made by training (end minus step 0, paired per seed).
    """

    init: Interval
    end: Interval
    training: Interval

    def at(self, phase: str) -> Interval:
        """The interval at ``phase`` (one of ``PHASES``)."""
        if phase not in PHASE_NAMES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        return getattr(self, phase)

    @property
    def origin(self) -> str:
        """Where the end effect comes from, in words (``effect_origin``)."""
        return effect_origin(self.init, self.end, self.training)


def phase_differences(a: Mapping[int, RunResult], b: Mapping[int, RunResult], name: str) -> PhaseDifferences:
    """``a - b`` of metric ``name`` paired per seed at every phase (``paired_at_phase``), with 95 % intervals."""
    init, end, training = (interval(paired_at_phase(a, b, name, phase)) for phase in PHASES)
    return PhaseDifferences(init, end, training)


PRESENT_AT_INIT = "present at initialisation"
PRESENT_AT_INIT_ONLY = "present at initialisation, unresolved at the end"
MADE_BY_TRAINING = "made by training"
GROWS = "grows with training"
SHRINKS = "shrinks with training"
REVERSED = "reversed by training"
NOT_RESOLVED = "not resolved at step 0 nor by training"
TOO_FEW_PAIRS = "n/a (fewer than 2 pairs)"
ORIGINS = (
    PRESENT_AT_INIT,
    PRESENT_AT_INIT_ONLY,
    MADE_BY_TRAINING,
    GROWS,
    SHRINKS,
    REVERSED,
    NOT_RESOLVED,
    TOO_FEW_PAIRS,
)
"""Every reading ``effect_origin`` gives."""


def _sign(iv: Interval) -> int:
    """+1 or -1 when the interval lies wholly above or below 0, else 0."""
    return 1 if iv.low > 0 else -1 if iv.high < 0 else 0


def effect_origin(init: Interval, end: Interval, training: Interval) -> str:
    """Where an end effect comes from, from the step-0 interval and the made-by-training one (each 95 %, paired per
    seed; docs/method.md, section 10, "Three phases"):

    - ``present at initialisation``: step 0's interval excludes 0 and the made-by-training one holds it, so the end
      effect cannot be told apart from the one the runs started with; ``present at initialisation, unresolved at
      the end`` when the end's interval holds 0 as well (the runs start apart and end too spread to say);
    - ``made by training``: step 0's interval holds 0 and the made-by-training one excludes it;
    - ``grows with training``: both exclude 0 on the same side (training adds to an effect present at step 0);
    - ``shrinks with training``: both exclude 0 on opposite sides, and the end's interval is not wholly on the far
      side of 0 from step 0's; ``reversed by training`` when it is;
    - ``not resolved at step 0 nor by training``: both hold 0;
    - ``n/a (fewer than 2 pairs)``: step 0's or the made-by-training interval is undefined.

    Each reading is descriptive, one interval against 0 at a time: no adjustment for the number of comparisons."""
    if not (init.defined and training.defined):
        return TOO_FEW_PAIRS
    at_init, by_training = _sign(init), _sign(training)
    if at_init and not by_training:
        return PRESENT_AT_INIT if end.defined and _sign(end) else PRESENT_AT_INIT_ONLY
    if by_training and not at_init:
        return MADE_BY_TRAINING
    if not at_init:
        return NOT_RESOLVED
    if at_init == by_training:
        return GROWS
    return REVERSED if end.defined and _sign(end) == -at_init else SHRINKS

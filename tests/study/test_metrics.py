"""Per-run metrics (``bhyt_pl.study.protocol.metrics``): the validation loss and every summary of every registered
statistic,
read from a snapshot, on the comparison scale, with their declared margins, and at each phase of a run (step 0, the
end, made by training) paired per seed by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from study_fixtures import BASE, fake_result

from bhyt_pl.callbacks.layer_stats import statistics
from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.metrics import (
    GROWS,
    MADE_BY_TRAINING,
    NOT_RESOLVED,
    ORIGINS,
    PHASES,
    PRESENT_AT_INIT,
    PRESENT_AT_INIT_ONLY,
    REVERSED,
    SHRINKS,
    TOO_FEW_PAIRS,
    VAL_LOSS,
    effect_origin,
    final_snapshot,
    metric,
    metrics,
    paired_at_phase,
    phase_differences,
    phase_value,
    snapshots,
    value,
)
from bhyt_pl.study.protocol.spec import RunResult


def test_every_summary_of_every_statistic_is_a_metric() -> None:
    names = list(metrics())
    expected = ["val_loss"] + [s.metric(stat.name) for stat in statistics() for s in stat.summaries]
    assert names == expected
    # the names the claims table and the report use
    assert {"magnitude", "magnitude_growth", "magnitude_growth_slope", "median_magnitude"} <= set(names)
    assert {"magnitude_per_coordinate", "variance", "variance_growth", "saturation"} <= set(names)
    # last-layer values are compared as ln ratios; growths are ln ratios already
    assert all(metric(n).log == (metric(n).summary.kind == "last") for n in names[1:])
    assert metric("magnitude").log and not metric("magnitude_growth").log and not metric("val_loss").log
    margins = {n: metric(n).margin for n in names if metric(n).margin is not None}
    assert margins == {
        "val_loss": 0.02,
        "magnitude": 0.2,
        "magnitude_growth": 0.2,
        "median_magnitude": 0.2,
        "magnitude_per_coordinate": 0.2,
        "variance": 0.4,
        "variance_growth": 0.4,
    }
    with pytest.raises(ValueError, match="metric must be one of .*'val_loss'.*, got 'loudness'"):
        metric("loudness")


def test_values_of_a_run_at_its_end_on_the_comparison_scale() -> None:
    run = fake_result(BASE, 3.25, magnitude=[1.0, 2.0, 4.0, 8.0])  # width 16
    assert value(run, "val_loss") == 3.25 and VAL_LOSS.margin == 0.02
    assert value(run, "magnitude") == pytest.approx(math.log(8.0))  # ln: compared as ratios
    assert value(run, "magnitude", compare=False) == 8.0
    assert value(run, "median_magnitude", compare=False) == 4.0  # half the mean token in these runs
    assert value(run, "magnitude_per_coordinate", compare=False) == pytest.approx(8.0 / 4.0)  # / sqrt(16)
    assert value(run, "variance", compare=False) == 64.0
    # layer L/4 = 1: ln(8 / 1); the slope of ln 2^(l-1) over layers 1..4 is ln 2
    assert value(run, "magnitude_growth") == pytest.approx(math.log(8.0))
    assert value(run, "magnitude_growth_slope") == pytest.approx(math.log(2.0))
    assert value(run, "variance_growth") == pytest.approx(2 * math.log(8.0))
    diverged = fake_result(BASE, 3.0, status="diverged")
    assert math.isnan(value(diverged, "val_loss")) and snapshots(diverged) == {}


def test_a_snapshot_over_training_and_the_final_one() -> None:
    run = fake_result(BASE, 3.25, magnitude=[1.0, 2.0, 4.0, 8.0])
    points = snapshots(run)
    assert sorted(points) == [0, 10]
    assert value(run, "magnitude", points[0]) == 0.0  # step 0: all ones
    end = final_snapshot(run)
    assert end["magnitude"] == [1.0, 2.0, 4.0, 8.0] and end["val_loss"] == 3.25 and end["step"] == 10
    assert math.isnan(value(RunResult(BASE), "magnitude"))  # no profile: NaN, not an error


def _run(seed_index: int, ln_start: float, ln_end: float) -> RunResult:
    """A finished run of 4 layers whose last-layer magnitude is ``exp(ln_start)`` at step 0 and ``exp(ln_end)`` at
    the end (the other layers 1)."""
    run = fake_result(replace(BASE, seed_index=seed_index), 3.0, [1.0, 1.0, 1.0, math.exp(ln_end)])
    start = dict(run.trajectory[0], magnitude=[1.0, 1.0, 1.0, math.exp(ln_start)])
    return replace(run, trajectory=[start, *run.trajectory[1:]])


def test_the_three_phases_paired_per_seed_by_hand() -> None:
    # two seeds; ln last-layer magnitude (step 0, end): target (0.2, 1.0), (0.4, 1.5); baseline (0.1, 2.0), (0.1, 2.2)
    target = {1: _run(1, 0.2, 1.0), 2: _run(2, 0.4, 1.5)}
    baseline = {1: _run(1, 0.1, 2.0), 2: _run(2, 0.1, 2.2)}
    t_975_1 = 12.706204736  # the two-sided 95 % t quantile at 1 degree of freedom
    # per-seed d: init 0.1, 0.3; end -1.0, -0.7; training (0.8 - 1.9, 1.1 - 2.1) = -1.1, -1.0
    # with 2 pairs the standard error is |d1 - d2| / 2: 0.1, 0.15, 0.05
    expected = {"init": (0.2, 0.1), "end": (-0.85, 0.15), "training": (-1.05, 0.05)}
    for phase, (mean, se) in expected.items():
        d = stats.paired_differences(
            {i: phase_value(r, "magnitude", phase) for i, r in target.items()},
            {i: phase_value(r, "magnitude", phase) for i, r in baseline.items()},
        )
        iv = stats.interval(d)
        assert (iv.n, iv.mean) == (2, pytest.approx(mean))
        assert (iv.low, iv.high) == (pytest.approx(mean - t_975_1 * se), pytest.approx(mean + t_975_1 * se))
    assert PHASES == ("init", "end", "training")
    assert phase_value(target[2], "magnitude", "end") == value(target[2], "magnitude") == pytest.approx(1.5)
    assert phase_value(target[2], "magnitude", "training") == pytest.approx(1.1)
    # the same pairs through paired_at_phase, and all three at once through phase_differences
    assert paired_at_phase(target, baseline, "magnitude", "training") == [pytest.approx(-1.1), pytest.approx(-1.0)]
    phases = phase_differences(target, baseline, "magnitude")
    for phase, (mean, se) in expected.items():
        iv = phases.at(phase)
        assert (iv.n, iv.mean, iv.high) == (2, pytest.approx(mean), pytest.approx(mean + t_975_1 * se))
    # step 0's interval 0.2 +- 1.27 holds 0, the made-by-training one -1.05 +- 0.64 does not
    assert phases.origin == MADE_BY_TRAINING
    # a seed missing on one side loses only its pair
    assert paired_at_phase({1: target[1]}, baseline, "magnitude", "init") == [pytest.approx(0.1)]
    with pytest.raises(ValueError, match=r"phase must be one of \('init', 'end', 'training'\), got 'start'"):
        phases.at("start")


def _iv(low: float, high: float, n: int = 5) -> stats.Interval:
    """An interval by its bounds (the mean midway): ``effect_origin`` reads only the bounds and ``n``."""
    return stats.Interval(n, (low + high) / 2, low, high, low, high)


@pytest.mark.parametrize(
    ("init", "end", "training", "reading"),
    [
        # step 0 decisive, training not: the end cannot be told apart from the start (the confirmation's test 1)
        (_iv(-1.88, -1.85), _iv(-2.06, -1.56), _iv(-0.19, 0.31), PRESENT_AT_INIT),
        (_iv(-1.88, -1.85), _iv(-3.1, 0.4), _iv(-1.3, 1.8), PRESENT_AT_INIT_ONLY),  # ... and the end holds 0
        (_iv(-0.15, 0.01), _iv(-1.66, -0.93), _iv(-1.51, -0.94), MADE_BY_TRAINING),  # step 0 holds 0
        (_iv(-0.09, -0.07), _iv(-1.33, -1.12), _iv(-1.26, -1.04), GROWS),  # both below 0 (test 4)
        (_iv(0.1, 0.3), _iv(1.2, 1.5), _iv(1.0, 1.3), GROWS),  # both above 0
        (_iv(-5.23, -5.2), _iv(-1.97, -1.14), _iv(3.26, 4.07), SHRINKS),  # opposite sides, the end still below (3)
        (_iv(-0.52, -0.24), _iv(-0.43, 0.41), _iv(0.003, 0.73), SHRINKS),  # ... the end holding 0
        (_iv(0.58, 0.68), _iv(-2.62, -0.58), _iv(-3.2, -1.26), REVERSED),  # the end on the other side of 0
        (_iv(-0.01, 0.01), _iv(-0.6, 1.1), _iv(-0.6, 1.1), NOT_RESOLVED),
        (_iv(-1.0, -0.5, n=1), _iv(-1.0, 1.0), _iv(-1.0, 1.0), TOO_FEW_PAIRS),
        (_iv(-1.0, -0.5), _iv(-1.0, 1.0), stats.interval([0.3]), TOO_FEW_PAIRS),  # one pair: NaN bounds
    ],
)
def test_where_an_end_effect_comes_from(
    init: stats.Interval, end: stats.Interval, training: stats.Interval, reading: str
) -> None:
    assert effect_origin(init, end, training) == reading
    assert reading in ORIGINS


def test_phases_of_the_loss_and_of_runs_without_a_start() -> None:
    run = _run(1, 0.0, 2.0)
    # the loss at step 0 (10.0 in these runs) is read the same way: training removed 10.0 - 3.0 nats
    assert phase_value(run, "val_loss", "init") == 10.0 and phase_value(run, "val_loss", "training") == -7.0
    no_start = replace(run, trajectory=run.trajectory[1:])
    assert phase_value(no_start, "magnitude", "end") == pytest.approx(2.0)
    assert math.isnan(phase_value(no_start, "magnitude", "init"))
    assert math.isnan(phase_value(no_start, "magnitude", "training"))
    diverged = replace(run, status="diverged")
    assert all(math.isnan(phase_value(diverged, "magnitude", phase)) for phase in PHASES)
    with pytest.raises(ValueError, match=r"phase must be one of \('init', 'end', 'training'\), got 'start'"):
        phase_value(run, "magnitude", "start")

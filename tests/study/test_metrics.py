"""Per-run metrics (``bhyt_pl.study.protocol.metrics``): the validation loss and every summary of every registered
statistic,
read from a snapshot, on the comparison scale, with their declared margins."""

from __future__ import annotations

import math

import pytest
from study_fixtures import BASE, fake_result

from bhyt_pl.callbacks.layer_stats import statistics
from bhyt_pl.study.protocol.metrics import VAL_LOSS, final_snapshot, metric, metrics, snapshots, value
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

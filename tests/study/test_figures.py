"""The report's figures (``bhyt_pl.study.report.figures``): one panel per declared statistic (a statistic registered
here
gets its own), the plotted lines hold the seed means, and depth figures read every group at the matched rate."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from study_fixtures import kept_design, synthetic_set

from bhyt_pl.callbacks.layer_stats import (
    LayerStatistic,
    OnBlockOutput,
    Summary,
    register_statistic,
    statistics,
    unregister_statistic,
)
from bhyt_pl.study.protocol.design import StudyRuns
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.report import figures


def _visible_titles(figure) -> list[str]:
    return [ax.get_title() for ax in figure.axes if ax.get_visible() and ax.get_title()]


@pytest.fixture
def doubled() -> Iterator[LayerStatistic]:
    """A statistic recorded along training with a titled summary, registered for one test."""
    stat = register_statistic(
        LayerStatistic(
            "doubled_magnitude",
            "2 ||y_t||_2",
            "twice the magnitude",
            OnBlockOutput(lambda x, y: 2 * y.norm(dim=-1)),
            trajectory=True,
            summaries=(Summary("last", title="last-layer doubled magnitude"),),
        )
    )
    yield stat
    unregister_statistic(stat.name)


def test_the_depth_profile_has_one_panel_per_recorded_block_statistic(doubled: LayerStatistic) -> None:
    names = [s.name for s in figures.profile_statistics()]
    assert names == [s.name for s in statistics() if s.trajectory and isinstance(s.measure, OnBlockOutput)]
    assert names[:4] == ["magnitude", "median_magnitude", "variance", "magnitude_top2_removed"]
    assert names[-1] == "doubled_magnitude"
    results, design = synthetic_set()
    figure = figures.depth_profile_figure(StudyRuns(results), design, "test")
    assert sorted(_visible_titles(figure)) == sorted(name.replace("_", " ") for name in names)
    # two rows filled column by column: magnitude above the median token, variance above the top-2-removed one
    axes = {ax.get_title(): ax for ax in figure.axes}
    assert axes["magnitude"].get_subplotspec().rowspan.start == 0
    assert axes["median magnitude"].get_subplotspec().rowspan.start == 1
    assert axes["variance"].get_subplotspec().colspan.start == 1
    assert axes["doubled magnitude"].get_subplotspec().colspan.start == 2


def test_the_trajectory_figure_has_one_panel_per_titled_summary_with_the_seed_means(doubled: LayerStatistic) -> None:
    titles = [summary.title for _, summary in figures.trajectory_panels()]
    assert titles == [
        "last-layer magnitude",
        "last-layer median-token magnitude (position 0 excluded)",
        "last-layer doubled magnitude",  # last-layer summaries first, in registration order
        "slope of ln magnitude vs layer (2..L)",
        "tanh saturation (mean over sites and layers)",
    ]
    results, design = synthetic_set()
    figure = figures.trajectory_figure(StudyRuns(results), design, "test")
    assert _visible_titles(figure) == titles
    panel = next(ax for ax in figure.axes if ax.get_title() == "last-layer magnitude")
    line = next(line for line in panel.lines if line.get_label() == "b")
    # b at the matched rate 1e-2 (the highest): last layer 4 e^offset at step 10, 1 at step 0
    expected = (4.0 + 4.0 * 2.718281828459045**0.1 + 4.0 * 2.718281828459045**-0.1) / 3
    assert list(line.get_xdata()) == [0, 10]
    assert list(line.get_ydata()) == pytest.approx([1.0, expected])
    assert panel.get_yscale() == "log"


# last-layer magnitude per (group, lr) over evaluation seeds 1-3
MAGNITUDES = {("bhyt", 1e-2): [80.0, 90.0, 100.0], ("bhyt", 3e-3): [20.0, 22.0, 30.0]}


def _run(group: str, lr: float, seed: int, magnitude: float) -> RunResult:
    spec = RunSpec(label=f"{group}@lr{lr:g}-s{seed}", norm=group, group=group, candidate=group, lr=lr, seed_index=seed)
    return RunResult(spec, n_layers=2, dim=4, val_loss=3.0, depth_final={"magnitude/layer_01": magnitude})


def test_depth_figures_read_every_group_at_the_highest_matched_rate() -> None:
    results = StudyRuns(_run(g, lr, s, m[s - 1]) for (g, lr), m in MAGNITUDES.items() for s in (1, 2, 3))
    matched = kept_design({"bhyt": 1e-2}, matched_lrs=(1e-3, 3e-3))
    assert [(r.spec.lr, r.spec.seed_index) for r in figures.depth_runs(results, matched, "bhyt")] == [
        (3e-3, s) for s in (1, 2, 3)
    ]
    assert figures.depth_runs_words(matched) == "every scheme at lr 0.003 (matched)"
    unmatched = kept_design({"bhyt": 1e-2})
    assert [r.spec.lr for r in figures.depth_runs(results, unmatched, "bhyt")] == [1e-2] * 3  # the best rate
    assert figures.depth_runs(results, matched, "bhyt_exact") == []  # no selection yet

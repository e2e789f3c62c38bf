"""The report's figures (``bhyt_pl.study.report.figures``): one panel per declared statistic (a statistic registered
here gets its own), the plotted lines hold the seed means of the runs each group is given, one colour per group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from study_fixtures import synthetic_set

from bhyt_pl.callbacks.layer_stats import (
    LayerStatistic,
    OnBlockOutput,
    Summary,
    register_statistic,
    statistics,
    unregister_statistic,
)
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.report import figures


def _at(results: list[RunResult], lr: float) -> list[figures.FigureGroup]:
    """Each group's evaluation seeds at ``lr``, b before a (not the order of the runs)."""
    return [
        figures.FigureGroup(g, [r for r in results if r.spec.group == g and r.spec.lr == lr and r.spec.seed_index])
        for g in ("b", "a")
    ]


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
    results, _ = synthetic_set()
    figure = figures.depth_profile_figure(_at(results, 1e-2), "test")
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
    results, _ = synthetic_set()
    figure = figures.trajectory_figure(_at(results, 1e-2), "test")
    assert _visible_titles(figure) == titles and figure.get_suptitle() == "test"
    panel = next(ax for ax in figure.axes if ax.get_title() == "last-layer magnitude")
    line = next(line for line in panel.lines if line.get_label() == "b")
    # b at 1e-2, the runs it was given: last layer 4 e^offset at step 10, 1 at step 0
    expected = (4.0 + 4.0 * 2.718281828459045**0.1 + 4.0 * 2.718281828459045**-0.1) / 3
    assert list(line.get_xdata()) == [0, 10]
    assert list(line.get_ydata()) == pytest.approx([1.0, expected])
    assert panel.get_yscale() == "log"


def test_each_group_keeps_the_colour_of_its_position_in_every_figure() -> None:
    """The colour follows the group's place in the sequence given, so two figures drawn from one sequence agree: a
    group without runs keeps its place (tab10's first colour), b and a get the second and third."""
    from matplotlib import colormaps

    results, _ = synthetic_set()
    groups = [figures.FigureGroup("none", []), *_at(results, 3e-3)]
    tab10 = colormaps["tab10"]
    for figure in (figures.depth_profile_figure(groups, "t"), figures.trajectory_figure(groups, "t")):
        panel = figure.axes[0]
        colors = {line.get_label(): line.get_color() for line in panel.lines}
        assert colors == {"b": tab10(1), "a": tab10(2)}

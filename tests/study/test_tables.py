"""The exploration's tables (``bhyt_pl.study.report.tables``) on hand-built runs: a statistic column shows each group's
seed interval, the edge flag follows a group into every table, the approximation table reads both groups at the
matched rate, and the detail table's seed counts by hand."""

from __future__ import annotations

import math
import re

import pytest
from study_fixtures import kept_design, synthetic, synthetic_set

from bhyt_pl.study.protocol import stats
from bhyt_pl.study.protocol.claims import ClaimSpec, evaluate
from bhyt_pl.study.protocol.design import StudyRuns
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.report import tables
from bhyt_pl.study.report.markdown import short_ci

T_975_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom


def _cells(text: str, first: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _header(text: str) -> list[str]:
    return [c.strip() for c in text.splitlines()[0].strip("|").split("|")]


def _numbers(cell: str) -> list[float]:
    """mean, low, high, min, max of a ``mean [low, high] (min-max)`` cell (positive values)."""
    match = re.fullmatch(r"(\S+) \[(\S+), (\S+)\] \((.+?)-(.+)\)", cell)
    assert match, cell
    return [float(x.replace(",", "")) for x in match.groups()]


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean = sum(values) / 3
    half = T_975_2 * math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
    return mean, mean - half, mean + half


def test_group_table_columns_hold_each_groups_seed_intervals() -> None:
    results, design = synthetic_set()
    text = tables.group_table(StudyRuns(results), design)
    header = _header(text)
    assert header[:6] == ["scheme", "candidate", "lr", "seeds ok", "val loss", "train loss"]
    b = _cells(text, "b")
    assert b[:4] == ["b", "b", "0.003", "3/3"]
    # last-layer magnitude of b at 3e-3: 4 e^offset over offsets 0, 0.1, -0.1, shown as the claims compare it: the
    # geometric mean 4 with the interval of the ln offsets back-transformed, 4 exp(+-t_{0.975,2} 0.1 / sqrt(3))
    seeds = [4.0, 4.0 * math.exp(0.1), 4.0 * math.exp(-0.1)]
    half = T_975_2 * 0.1 / math.sqrt(3)
    assert _numbers(b[header.index("last-layer magnitude (mean token)")]) == pytest.approx(
        [4.0, 4.0 * math.exp(-half), 4.0 * math.exp(half), min(seeds), max(seeds)], rel=2e-3
    )
    # the median token is half the mean token in these runs; the per-coordinate magnitude is it over sqrt(16)
    assert _numbers(b[header.index("median token")])[0] == pytest.approx(2.0, rel=2e-3)
    assert _numbers(b[header.index("per coordinate (/sqrt d)")])[0] == pytest.approx(1.0, rel=2e-3)
    # growth is compared as it is (already ln ratios): an arithmetic mean
    mean, low, high = _interval([math.log(v) - 0.0 for v in seeds])  # layer L/4 of b is 1
    assert _numbers(b[header.index("ln magnitude growth L/4..L")])[:3] == pytest.approx([mean, low, high], rel=2e-3)
    assert b[header.index("tanh saturation")] == "-"  # no scheme site reports it in these runs


def test_matched_table_shows_the_claimable_summaries_at_every_matched_rate() -> None:
    results, design = synthetic_set()
    text = tables.matched_table(StudyRuns(results), design)
    header = _header(text)
    assert "magnitude w/o top-2 channels" not in header and "ln magnitude slope/layer L/4..L" not in header
    claimable = {"last-layer magnitude (mean token)", "ln magnitude growth L/4..L", "ln variance growth L/4..L"}
    assert claimable <= set(header)
    rows = [[c.strip() for c in line.split("|")[1:3]] for line in text.splitlines()[2:]]
    assert rows == [["a", "0.003"], ["b", "0.003"], ["a", "0.01"], ["b", "0.01"]]


def test_the_edge_flag_appears_in_every_table_that_uses_the_group() -> None:
    results, design = synthetic_set()
    design = kept_design({"a": 1e-3, "b": 3e-3}, (3e-3, 1e-2), edges={"a": "lowest"})
    runs = StudyRuns([*results, *(synthetic(g, lr, 0, [1.0], 3.0) for g, lr in (("a", 1e-3), ("b", 3e-3)))])
    for text in (tables.group_table(runs, design), tables.lr_table(runs, design)):
        assert "a (edge: lowest)" in text and "b (edge" not in text
    row = ClaimSpec("A's loss is below B's", "Table 1", "A", "B", "val_loss", "best", "lower")
    matched = ClaimSpec("A below B", "Figure 3", "A", "B", "magnitude", "matched", "lower")
    items, _ = evaluate(runs, design, {"A": "a", "B": "b"}, claims=(row, matched))
    summary = tables.summary_table(items, design)
    best_rows = [line for line in summary.splitlines() if "| best |" in line]
    assert best_rows and all("(edge: a)" in line for line in best_rows)
    assert all("(edge:" not in line for line in summary.splitlines() if "| matched |" in line)


def test_lr_table_bolds_the_kept_run_and_names_diverged_ones() -> None:
    design = kept_design({"a": 1e-3})
    ok = synthetic("a", 1e-3, 0, [1.0], 3.25)
    diverged = synthetic("a", 1e-2, 0, [1.0], 3.0)
    diverged.status, diverged.diverged_step = "diverged", 7
    text = tables.lr_table(StudyRuns([ok, diverged]), design)
    assert _header(text) == ["scheme", "candidate", "lr 0.001", "lr 0.01"]
    assert _cells(text, "a") == ["a", "a", "**3.25**", "diverged @7"]


def test_seeds_for_a_decisive_tost_use_its_90_percent_interval() -> None:
    """The detail table's 'seeds for a decisive CI' of an equivalence claim: t_{0.95} (the TOST's 90 % interval)."""
    results, design = synthetic_set()
    row = ClaimSpec("A ~ B", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", margin=1.05)
    items, _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row,))
    low = items[0].tests[0]
    # mean -1, sd 0.05, 3 pairs: room 0.05; the 90 % half-width t_{0.95,2} 0.05 / sqrt(3) = 0.084 does not fit
    assert low.rate == "0.003" and low.verdict == "inconclusive"
    # smallest n with t_{0.95,n-1} / sqrt(n) < 1: n = 5 (2.132 / 2.236 = 0.953; n = 4: 2.353 / 2 = 1.18);
    # the 95 % interval's t_{0.975} would say n = 7 (2.447 / 2.646 = 0.925; n = 6: 2.571 / 2.449 = 1.05)
    line = next(x for x in tables.detail_table(items).splitlines() if "| 0.003 |" in x)
    assert line.rstrip(" |").endswith("| 5")
    assert "| magnitude (ln ratio) |" in line


def test_a_tost_row_quotes_its_90_percent_interval_and_plug_in_seeds_say_what_they_are() -> None:
    results, design = synthetic_set()
    row = ClaimSpec("A ~ B", "Figure 3", "A", "B", "magnitude", "matched", "equivalent", margin=1.05)
    lower = ClaimSpec("A below B", "Figure 3", "A", "B", "magnitude", "matched", "lower")
    items, _ = evaluate(results, design, {"A": "a", "B": "b"}, claims=(row, lower))
    summary = tables.summary_table(items, design)
    assert "difference [95 % CI; 90 % for ~]" in summary.splitlines()[0]
    tost, directional = items[0].tests[0], items[1].tests[0]
    tost_line = next(x for x in summary.splitlines() if x.startswith("| A ~ B"))
    # by hand: mean -1, sd 0.05 over 3 pairs; the 90 % half-width t_{0.95,2} 0.05 / sqrt(3) = 0.0843
    half = 2.919985580355516 * 0.05 / math.sqrt(3)
    assert (tost.difference_90.low, tost.difference_90.high) == pytest.approx((-1 - half, -1 + half))
    assert f"{short_ci(tost.difference_90)}; " in tost_line and tost_line.count("(90 %)") == 1
    assert short_ci(tost.difference) not in tost_line
    lower_line = next(x for x in summary.splitlines() if x.startswith("| A below B"))
    assert short_ci(directional.difference) in lower_line and "(90 %)" not in lower_line
    assert "plug-in seeds, this test alone (~50 % power)" in tables.detail_table(items).splitlines()[0]


def test_no_interval_on_a_magnitude_goes_below_zero() -> None:
    """A last layer spread over a factor of 30 across 3 seeds (as LNS's in the committed pilot): its arithmetic
    95 % interval reaches below 0, the geometric one shown instead does not, and is exp(mean ln +- t se)."""
    values = [20.0, 100.0, 600.0]
    assert stats.interval(values).low < 0
    runs = [synthetic("a", 3e-3, i + 1, [1.0, 1.0, 1.0, v], 3.0) for i, v in enumerate(values)]
    design = kept_design({"a": 3e-3}, (3e-3,))
    text = tables.matched_table(StudyRuns(runs), design)
    cell = _cells(text, "a")[_header(text).index("last-layer magnitude (mean token)")]
    ln = [math.log(v) for v in values]
    mean, low, high = _interval(ln)
    expected = [math.exp(mean), math.exp(low), math.exp(high), 20.0, 600.0]
    assert _numbers(cell) == pytest.approx(expected, rel=5e-3)  # 3 significant digits
    assert _numbers(cell)[1] > 0


# ----------------------------------------------------------------------------- approximated statistics
# last-layer magnitude per (group, lr) over evaluation seeds 1-3; variance is magnitude squared / 10
MAGNITUDES = {
    ("bhyt", 1e-2): [80.0, 90.0, 100.0],  # bhyt's best rate: large, as depth statistics grow with the rate
    ("bhyt", 3e-3): [20.0, 22.0, 30.0],
    ("bhyt_exact", 3e-3): [4.0, 5.0, 5.0],  # bhyt_exact's best rate, the matched one
}


def _run(group: str, lr: float, seed: int, magnitude: float) -> RunResult:
    spec = RunSpec(label=f"{group}@lr{lr:g}-s{seed}", norm=group, group=group, candidate=group, lr=lr, seed_index=seed)
    depth = {"magnitude/layer_00": 1.0, "magnitude/layer_01": magnitude}
    depth.update({"variance/layer_00": 1.0, "variance/layer_01": magnitude**2 / 10})
    depth.update({"bhyt_moment_ratio/layer_00": 0.5, "bhyt_moment_ratio/layer_01": 1.0} if group == "bhyt" else {})
    return RunResult(spec, n_layers=2, dim=4, val_loss=3.0, depth_final=depth)


def _expected(a: list[float], b: list[float], power: int) -> tuple[float, float, float]:
    """exp of the mean and 95% t-interval of the seed-paired ln ratios (a / b) ** power."""
    d = [power * (math.log(x) - math.log(y)) for x, y in zip(a, b, strict=True)]
    mean = sum(d) / 3
    half = T_975_2 * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _parse(cell: str) -> tuple[float, tuple[float, float, float]]:
    match = re.fullmatch(r"([0-9.e-]+): ([0-9.,e+-]+) \[([0-9.,e+-]+), ([0-9.,e+-]+)\]", cell)
    assert match, cell
    lr, *values = (float(g.replace(",", "")) for g in match.groups())
    return lr, tuple(values)


def test_approximation_ratios_compare_both_groups_at_each_matched_rate() -> None:
    results = [_run(g, lr, s, m[s - 1]) for (g, lr), m in MAGNITUDES.items() for s in (1, 2, 3)]
    design = kept_design({"bhyt": 1e-2, "bhyt_exact": 3e-3}, matched_lrs=(3e-3,))

    text = tables.approximation_table(StudyRuns(results), design, "bhyt_exact")
    cells = _cells(text, "bhyt")
    assert cells[1:5] == ["0.75", "n/a", "n/a", "n/a"]  # moment ratio at bhyt's best rate: layers 0-1 only
    read = {}
    for column, power in ((5, 1), (6, 2)):  # magnitude, variance (= magnitude squared / 10)
        lr, values = read[column] = _parse(cells[column])
        expected = _expected(MAGNITUDES[("bhyt", 3e-3)], MAGNITUDES[("bhyt_exact", 3e-3)], power)
        assert lr == 3e-3
        assert all(math.isclose(v, e, rel_tol=5e-3) for v, e in zip(values, expected, strict=True)), (values, expected)
    # at bhyt's best rate (1e-2) the magnitude ratio would be about 19: not what the table reads
    assert _expected(MAGNITUDES[("bhyt", 1e-2)], MAGNITUDES[("bhyt_exact", 3e-3)], 1)[0] > 15 > read[5][1][0]
    assert _cells(text, "bhyt_exact")[5:] == ["-", "-"]


def test_growth_words_follow_the_interval() -> None:
    from bhyt_pl.study.protocol import stats

    assert tables.growth_words(stats.interval([0.5, 0.6, 0.55])) == "grows with depth"
    assert tables.growth_words(stats.interval([-0.5, -0.6, -0.55])) == "shrinks with depth"
    assert tables.growth_words(stats.interval([0.01, -0.01, 0.0])) == "flat (within +-0.2 in ln)"
    assert tables.growth_words(stats.interval([0.5])) == "unresolved (fewer than 2 seeds)"
    assert tables.growth_margin() == pytest.approx(0.2)  # the magnitude growth's declared margin

"""The report's table machinery (``bhyt_pl.study.report.markdown``): column entries, rows of the wrong width refused,
and
numbers and intervals written one way."""

from __future__ import annotations

import math

import pytest

from bhyt_pl.study.protocol import stats
from bhyt_pl.study.report.markdown import (
    Column,
    ci,
    geometric_ci,
    markdown_table,
    num,
    short_ci,
    signed_ci,
    table,
)


def test_a_table_is_its_columns_over_its_rows() -> None:
    columns = [Column("name", lambda r: r["name"]), Column("twice", lambda r: str(2 * r["x"]))]
    text = table(columns, [{"name": "a|b", "x": 1}, {"name": "c", "x": 4}])
    assert text.splitlines() == ["| name | twice |", "| --- | --- |", "| a\\|b | 2 |", "| c | 8 |"]
    assert table(columns, [], empty="(nothing)") == "(nothing)"
    assert table(columns, []).splitlines() == ["| name | twice |", "| --- | --- |"]


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match=r"table row 1 has 3 cells for 2 columns \['a', 'b'\]"):
        markdown_table(["a", "b"], [["1", "2"], ["1", "2", "3"]])


@pytest.mark.parametrize(
    ("x", "digits", "text"),
    [
        (None, 3, "-"),
        (math.nan, 3, "n/a"),
        (math.inf, 3, "inf"),
        (0.0123456, 3, "0.0123"),
        (3.10, 4, "3.1"),
        (12.3456, 3, "12.346"),
        (1234.5, 3, "1,234"),  # banker's rounding of 1234.5 is 1234
        (2.5e-4, 3, "2.50e-04"),
        (3.2e6, 3, "3.20e+06"),
    ],
)
def test_numbers(x: float | None, digits: int, text: str) -> None:
    assert num(x, digits) == text


def test_intervals() -> None:
    assert ci(stats.interval([])) == "n/a" and ci(stats.interval([2.0])) == "2 (n=1)"
    iv = stats.interval([1.0, 2.0, 4.0])  # mean 7/3, half-width 4.3027 * sqrt(7/3) / sqrt(3) = 3.7946
    assert ci(iv) == "2.333 [-1.461, 6.128] (1-4)"
    assert short_ci(iv) == "2.333 [-1.461, 6.128]" and short_ci(stats.interval([])) == "n/a"


def test_signed_intervals_carry_their_signs_and_three_decimals() -> None:
    iv = stats.interval([1.0, 2.0, 4.0])  # as above: 2.333 [-1.461, 6.128]
    assert signed_ci(iv) == "+2.333 [-1.461, +6.128]"
    assert signed_ci(stats.interval([-0.0573])) == "-0.057 (n=1)" and signed_ci(stats.interval([])) == "n/a"
    # a value that rounds to zero reads +0.000 whatever its sign: two pairs -1e-7 and +1e-7 (half-width ~1e-6)
    assert signed_ci(stats.interval([-1e-7, 1e-7])) == "+0.000 [+0.000, +0.000]"
    assert signed_ci(stats.interval([-2e-7, -1e-7])) == "+0.000 [+0.000, +0.000]"


def test_geometric_intervals_are_back_transformed_and_positive() -> None:
    g = stats.geometric_mean([1.0, 2.0, 4.0])  # ln: 0, ln 2, 2 ln 2: mean ln 2, sd ln 2
    half = 4.302652729911275 * math.log(2) / math.sqrt(3)
    assert (g.mean, g.low, g.high) == pytest.approx((2.0, 2.0 * math.exp(-half), 2.0 * math.exp(half)))
    assert geometric_ci(g) == f"2 [{num(g.low)}, {num(g.high)}] (1-4)" and g.low > 0
    assert geometric_ci(stats.geometric_mean([])) == "n/a" and geometric_ci(stats.geometric_mean([3.0])) == "3 (n=1)"

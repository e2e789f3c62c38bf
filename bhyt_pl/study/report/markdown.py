"""The report's table machinery: a table is a list of ``Column`` entries (a header and the function that fills its
cell from one row) over a list of rows, rendered as a markdown table; numbers and seed intervals are written one
way everywhere.

Example:
    >>> rows = [("bhyt", 3.0123), ("rmsnorm", 3.1)]
    >>> print(table([Column("scheme", lambda r: r[0]), Column("val loss", lambda r: num(r[1], 4))], rows))
    | scheme | val loss |
    | --- | --- |
    | bhyt | 3.0123 |
    | rmsnorm | 3.1 |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from bhyt_pl.study.protocol.stats import GeometricMean, Interval

__all__ = ["Column", "ci", "geometric_ci", "markdown_table", "num", "short_ci", "signed_ci", "table"]

Row = TypeVar("Row")


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column of a table: its header and the function that writes its cell for a row."""

    header: str
    cell: Callable[[Row], str]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table; a row whose width differs from the header's raises ``ValueError`` (its cells would sit
    under the wrong headers)."""
    lines = [_line(header), _line(["---"] * len(header))]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"table row {i} has {len(row)} cells for {len(header)} columns {list(header)}: {row}")
        lines.append(_line(row))
    return "\n".join(lines)


def table(columns: Sequence[Column[Row]], rows: Iterable[Row], empty: str | None = None) -> str:
    """``columns`` over ``rows``; ``empty`` (when given) stands for a table without rows."""
    rows = list(rows)
    if not rows and empty is not None:
        return empty
    return markdown_table([c.header for c in columns], [[c.cell(row) for c in columns] for row in rows])


def num(value: float | None, digits: int = 3) -> str:
    """A number as the report writes it: ``digits`` significant digits below 1, ``digits`` decimals (trailing
    zeros dropped) up to 100, thousands separators above, scientific below 1e-3 and from 1e5; ``-`` for None,
    ``n/a`` for NaN."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    magnitude = abs(value)
    if magnitude >= 1e5 or (0 < magnitude < 1e-3):
        return f"{value:.{digits - 1}e}"
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if magnitude < 1 else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def ci(iv: Interval, digits: int = 3) -> str:
    """``mean [low, high] (min-max)`` over seeds; ``mean (n=1)`` without an interval, ``n/a`` without values."""
    if iv.n == 0:
        return "n/a"
    if not iv.defined:
        return f"{num(iv.mean, digits)} (n={iv.n})"
    spread = f"({num(iv.minimum, digits)}-{num(iv.maximum, digits)})"
    return f"{num(iv.mean, digits)} [{num(iv.low, digits)}, {num(iv.high, digits)}] {spread}"


def geometric_ci(g: GeometricMean, digits: int = 3) -> str:
    """``geometric mean [low, high] (min-max)`` of a positive quantity over seeds, the interval back-transformed
    from the ln scale (so never below 0); ``mean (n=1)`` without an interval, ``n/a`` without values."""
    if g.n == 0:
        return "n/a"
    if not g.defined:
        return f"{num(g.mean, digits)} (n={g.n})"
    spread = f"({num(g.minimum, digits)}-{num(g.maximum, digits)})"
    return f"{num(g.mean, digits)} [{num(g.low, digits)}, {num(g.high, digits)}] {spread}"


def short_ci(iv: Interval) -> str:
    """``mean [low, high]``: an interval without its spread."""
    if not iv.defined:
        return f"{num(iv.mean)} (n={iv.n})" if iv.n else "n/a"
    return f"{num(iv.mean)} [{num(iv.low)}, {num(iv.high)}]"


def signed_ci(iv: Interval) -> str:
    """``+mean [+low, +high]`` with signs and three decimals, for differences whose side of 0 is the point (the
    phases of a comparison); ``+mean (n=1)`` without an interval, ``n/a`` without values."""
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"

    def signed(x: float) -> str:
        return f"{round(x, 3) + 0.0:+.3f}"  # + 0.0: a value that rounds to zero reads +0.000, never -0.000

    if not iv.defined:
        return f"{signed(iv.mean)} (n={iv.n})"
    return f"{signed(iv.mean)} [{signed(iv.low)}, {signed(iv.high)}]"

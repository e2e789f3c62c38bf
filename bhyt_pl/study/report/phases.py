"""The three phases of a depth comparison as both reports show them: at initialisation (step 0), at the end, and made
by training (end minus step 0), each paired per seed on the comparison's scale
(``bhyt_pl.study.protocol.metrics.phase_differences``), with the words ``effect_origin`` gives for where the end
effect comes from, and the sentence that says which of the columns were declared before the runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

from bhyt_pl.study.protocol.metrics import END, PhaseDifferences
from bhyt_pl.study.report.markdown import Column, signed_ci

__all__ = ["DESCRIPTION", "READINGS", "phase_columns", "phases_note", "share_at_init"]

Row = TypeVar("Row")

DESCRIPTION = (
    "Each comparison at three phases of the same runs, each paired per seed on its own scale (ln ratio for a "
    "magnitude or variance, the difference of ln growth ratios for a growth): at initialisation (the step-0 "
    "trajectory point), at the end, and made by training (per seed, the end's difference minus step 0's); mean "
    "[95 % CI] each. Step 0 / end: the share of the end's mean already there at step 0 (where the end's interval "
    "excludes 0)."
)
"""What the phases table shows, for the paragraph above it."""

READINGS = (
    'The column *reads* (docs/method.md, section 10, "Three phases"); each interval is read alone against 0, '
    "uncorrected:\n\n"
    "- *present at initialisation*: step 0's interval excludes 0 and the made-by-training one holds it, so the end "
    "effect cannot be told apart from the one the runs started with (*unresolved at the end* added where the end's "
    "interval holds 0 too);\n"
    "- *made by training*: step 0's interval holds 0 and the made-by-training one excludes it;\n"
    "- *grows* / *shrinks with training*: both exclude 0 on the same / opposite sides (*reversed by training* where "
    "the end lies wholly on the other side of 0 from step 0);\n"
    "- *not resolved at step 0 nor by training*: both hold 0."
)
"""How the table's *reads* column is worded (``metrics.effect_origin``), as a list below the paragraph."""


def share_at_init(p: PhaseDifferences) -> str:
    """Step 0's mean as a share of the end's (``6 %``, ``336 %``): ``-`` where the end's interval holds 0 (a share
    of an effect that may be nothing) or either mean is missing."""
    if not (p.end.defined and (p.end.low > 0 or p.end.high < 0)) or not math.isfinite(p.init.mean):
        return "-"
    return f"{100 * p.init.mean / p.end.mean:.0f} %"


def phase_columns(phases: Callable[[Row], PhaseDifferences | None]) -> list[Column[Row]]:
    """The three phases' columns, the share at step 0 and the reading, of the ``PhaseDifferences`` a row has
    (``-`` in every column for a row without them)."""

    def cell(write: Callable[[PhaseDifferences], str]) -> Callable[[Row], str]:
        def fill(row: Row) -> str:
            p = phases(row)
            return "-" if p is None else write(p)

        return fill

    return [
        Column("at initialisation (step 0)", cell(lambda p: signed_ci(p.init))),
        Column("at the end", cell(lambda p: signed_ci(p.end))),
        Column("made by training (end - step 0)", cell(lambda p: signed_ci(p.training))),
        Column("step 0 / end", cell(share_at_init)),
        Column("reads", cell(lambda p: p.origin)),
    ]


def phases_note(declared: Iterable[str], rows: str) -> str:
    """Which phase columns are exploratory, from the phase each of the ``rows`` (``"claim"``, ``"test"``) declared
    before its runs (``ClaimSpec.phase``, a frozen plan's ``PlannedTest.phase``): every one but the declared one."""
    if set(declared) <= {END}:
        return (
            f"No {rows} here declared a phase other than the end before these runs: the step-0 and made-by-training "
            "columns are exploratory (uncorrected and descriptive; they decide nothing)."
        )
    return (
        f"Each {rows}'s verdict reads the phase it declared before these runs (named in the {rows} where it is not "
        "the end); its other two phase columns are exploratory (uncorrected and descriptive; they decide nothing)."
    )

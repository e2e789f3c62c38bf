"""The phases of a comparison as the reports show them (``bhyt_pl.study.report.phases``): a two-seed example of the
three phases worked out by hand through the exploration's and the confirmation's tables, the share at step 0, which
rows are shown, and the sentence that says which columns were declared before the runs."""

from __future__ import annotations

import math
from dataclasses import replace

from study_fixtures import kept_design, synthetic

from bhyt_pl.study.protocol import power_plan, stats
from bhyt_pl.study.protocol.claims import ClaimSpec, evaluate
from bhyt_pl.study.protocol.confirmation import Evaluation, FamilyResult
from bhyt_pl.study.protocol.metrics import PhaseDifferences, phase_differences
from bhyt_pl.study.protocol.spec import RunResult
from bhyt_pl.study.report import confirmation, tables
from bhyt_pl.study.report.phases import phase_columns, phases_note, share_at_init

RATE = 3e-3

# ln last-layer magnitude (step 0, end) by seed: per-seed d at step 0 0.1, 0.3; at the end -1.0, -0.7; made by
# training (1.0 - 0.2) - (2.0 - 0.1) = -1.1 and (1.5 - 0.4) - (2.2 - 0.1) = -1.0. With two pairs the standard error is
# |d1 - d2| / 2 and the 95 % half-width 12.706 times it:
#   step 0:           0.2 +- 12.706 * 0.1  = 0.2 +- 1.2706  -> +0.200 [-1.071, +1.471]
#   end:            -0.85 +- 12.706 * 0.15 = -0.85 +- 1.9059 -> -0.850 [-2.756, +1.056]
#   made by training: -1.05 +- 12.706 * 0.05 = -1.05 +- 0.6353 -> -1.050 [-1.685, -0.415]
LN_MAGNITUDE = {"a": {1: (0.2, 1.0), 2: (0.4, 1.5)}, "b": {1: (0.1, 2.0), 2: (0.1, 2.2)}}
ARMS = ["+0.200 [-1.071, +1.471]", "-0.850 [-2.756, +1.056]", "-1.050 [-1.685, -0.415]"]


def _run(group: str, seed: int) -> RunResult:
    """A finished 4-layer run whose last-layer magnitude is e^start at step 0 and e^end at the end."""
    start, end = LN_MAGNITUDE[group][seed]
    run = synthetic(group, RATE, seed, [1.0, 1.0, 1.0, math.exp(end)], 3.0)
    first = dict(run.trajectory[0], magnitude=[1.0, 1.0, 1.0, math.exp(start)])
    return replace(run, trajectory=[first, *run.trajectory[1:]])


def _cells(text: str, first: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first} "))
    return [c.strip() for c in line.strip("|").split("|")]


def test_two_seeds_through_the_explorations_tables() -> None:
    runs = [_run(g, s) for g in ("a", "b") for s in (1, 2)]
    design = kept_design({"a": RATE, "b": RATE}, (RATE,))
    rows = (
        ClaimSpec("A's magnitude is below B's", "Figure 3", "A", "B", "magnitude", "matched", "lower"),
        ClaimSpec("A's loss is below B's", "Table 1", "A", "B", "val_loss", "best", "lower"),
    )
    items, _ = evaluate(runs, design, {"A": "a", "B": "b"}, claims=rows)
    text = tables.phases_table(items)
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header[4:7] == ["at initialisation (step 0)", "at the end", "made by training (end - step 0)"]
    cells = _cells(text, tables.claim_name(items[0]))
    # step 0 holds 0 and training does not: made by training; the end's interval holds 0, so no share is given
    assert cells == [tables.claim_name(items[0]), "0.003", "ln ratio", "2", *ARMS, "-", "made by training"]
    assert len(text.splitlines()) == 3  # the loss claim is left out: its step 0 is the untrained model's loss
    # claims over training: the step-0 point and the same made-by-training interval
    over = _cells(tables.training_table(items), tables.claim_name(items[0]))
    assert over[3].startswith("0.2 [-1.071, 1.471] @0") and over[-1] == ARMS[2]


def test_two_seeds_through_the_confirmations_tables() -> None:
    a, b = {s: _run("a", s) for s in (1, 2)}, {s: _run("b", s) for s in (1, 2)}
    planned = power_plan.PlannedTest(
        "A < B: magnitude", "a", "b", "magnitude", "lower", 0.0, RATE, 3, -1.0, 0.1, -1.1, -0.9, 0.9, 0.2, 0.05, 3, 2,
        power_plan.PRIMARY, "", 3, 0.9,
    )  # fmt: skip
    d = stats.interval([-1.0, -0.7])
    test = FamilyResult(planned, (), (), d, stats.interval([-1.0, -0.7], 0.9), 0.1, 0.1, stats.NOT_CONFIRMED)
    evaluation = Evaluation((replace(test, phases=phase_differences(a, b, "magnitude")),), ())
    assert _cells(confirmation.phases_table(evaluation), "1") == [
        "1", "A < B: magnitude", "ln ratio", "2", *ARMS, "-", "made by training"
    ]  # fmt: skip
    # a test without phases (none computed) shows dashes, not numbers
    assert _cells(confirmation.phases_table(Evaluation((test,), ())), "1")[4:] == ["-"] * 5


def _phases(init: float, end: float, end_low: float, end_high: float) -> PhaseDifferences:
    def iv(mean: float, low: float, high: float) -> stats.Interval:
        return stats.Interval(7, mean, low, high, low, high)

    return PhaseDifferences(iv(init, init - 0.01, init + 0.01), iv(end, end_low, end_high), iv(end - init, -1, 1))


def test_the_share_at_step_0_is_given_only_for_an_end_effect() -> None:
    # the confirmation's tests 4 and 3: -0.0795 / -1.227 = 6.5 %, -5.215 / -1.551 = 336 %
    assert share_at_init(_phases(-0.0795, -1.227, -1.334, -1.121)) == "6 %"
    assert share_at_init(_phases(-5.215, -1.551, -1.965, -1.138)) == "336 %"
    assert share_at_init(_phases(-0.5, -0.2, -3.6, 3.2)) == "-"  # the end's interval holds 0
    columns = phase_columns(lambda row: row)
    assert [c.cell(None) for c in columns] == ["-"] * 5


def test_the_note_says_which_phase_columns_are_exploratory() -> None:
    assert phases_note(["end", "end"], "test").startswith(
        "No test here declared a phase other than the end before these runs: the step-0 and made-by-training columns "
        "are exploratory"
    )
    assert phases_note([], "claim").startswith("No claim here declared")
    declared = phases_note(["end", "training"], "test")
    assert declared.startswith("Each test's verdict reads the phase it declared before these runs")
    assert "other two phase columns are exploratory" in declared

"""The per-scheme columns both reports share (``bhyt_pl.study.report.columns``) on hand-built runs: a column added in a
test shows its values, a seed column's interval against a hand computation, a diverged or failed run has no value,
and the mean skips what is not finite."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from study_fixtures import synthetic_set

from bhyt_pl.study.protocol.design import StudyRuns
from bhyt_pl.study.protocol.spec import RunStatus
from bhyt_pl.study.report import columns
from bhyt_pl.study.report.markdown import Column, table

T_975_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom


def _cells(text: str, first: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_column_added_in_a_test_shows_its_values() -> None:
    results, design = synthetic_set()
    runs = StudyRuns(results)
    rows = [
        columns.SeedRuns(g.label, design.kept(g.label).lr, design.evaluation_runs(runs, g.label)) for g in design.groups
    ]
    shown = [Column("scheme", lambda row: row.label), columns.seed_column("val loss here", "val_loss", 4)]
    shown.append(Column("first seed's label", lambda row: row.runs[0].spec.label))
    text = table(shown, rows)
    assert text.splitlines()[0] == "| scheme | val loss here | first seed's label |"
    assert _cells(text, "a")[2] == "a@lr0.001-s1" and _cells(text, "b")[2] == "b@lr0.003-s1"
    # a's validation losses at its best rate: 2.9 + offset + 0.01 i = 2.91, 3.02, 2.83
    values = [2.91, 3.02, 2.83]
    mean = sum(values) / 3
    half = T_975_2 * math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
    numbers = re.fullmatch(r"(\S+) \[(\S+), (\S+)\] \((.+?)-(.+)\)", _cells(text, "a")[1])
    assert numbers, _cells(text, "a")[1]
    assert [float(x) for x in numbers.groups()] == pytest.approx([mean, mean - half, mean + half, 2.83, 3.02], abs=1e-4)


def test_a_diverged_run_has_no_value_and_the_mean_skips_what_is_not_finite() -> None:
    results, _ = synthetic_set()
    a = [r for r in results if r.spec.group == "a" and r.spec.lr == 1e-3]
    a[1] = dataclasses.replace(a[1], status=RunStatus.DIVERGED, diverged_step=7, diverged_loss=math.inf)
    values = columns.per_seed(a, "val_loss")
    assert list(values) == [1, 2, 3] and math.isnan(values[2])
    assert columns.finite_mean(values.values()) == pytest.approx((2.91 + 2.83) / 2)
    assert columns.finite_mean([None, math.inf, math.nan]) != columns.finite_mean([None, math.inf, math.nan])  # NaN
    assert columns.diverged_cell(a[1]) == "yes, step 7 (loss inf)" and columns.diverged_cell(a[0]) == "no"
    row = columns.SeedRuns("a", 1e-3, a)
    assert row.ok == [a[0], a[2]]
    matched = {c.header: c.cell(row) for c in columns.matched_columns()}
    assert matched["seeds ok"] == "2/3" and matched["lr"] == "0.001"

"""The confirmation's report (``bhyt_pl.study.report.confirmation``): the family's rows on the test's scale against hand
computations (the geometric mean of the per-seed ratios with its interval back-transformed from the ln scale, the
one-sided bound), groups as geometric means over the confirmation's seeds only, the committed report rebuilt from its
record alone byte for byte (rendering writes nothing else), and docs/method.md's declaration of the family rendered
from the code's rows and the committed pilot's plan."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from study_fixtures import layer_run, pilot_spec, write_pilot

from bhyt_pl.study.cli import confirmation_plan as confirm
from bhyt_pl.study.protocol import power_plan, stats
from bhyt_pl.study.protocol.confirmation import Evaluation, FamilyResult, p_value
from bhyt_pl.study.protocol.size import RunSize
from bhyt_pl.study.record.results import StudyRecord, load
from bhyt_pl.study.report.confirmation import (
    declared_family_table,
    declared_rows_table,
    estimate,
    family_table,
    groups_table,
    write_report,
)

KIND = "confirmation"

ROOT = Path(__file__).resolve().parents[2]
T_975_2, T_95_2 = 4.302652729911275, 2.919985580355516  # Student's t quantiles with 2 degrees of freedom


def _result(statistic: str, values: list[float]) -> FamilyResult:
    planned = power_plan.PlannedTest(
        f"A < B: {statistic}",
        "a",
        "b",
        statistic,
        "lower",
        0.0,
        3e-3,
        3,
        -1.0,
        0.1,
        -1.1,
        -0.9,
        0.9,
        0.2,
        0.05,
        3,
        3,
        power_plan.PRIMARY,
        "",
        3,
        0.9,
    )
    d = stats.interval(values)
    p = p_value(d, "lower")
    return FamilyResult(planned, (), (), d, stats.interval(values, 0.90), p, p, stats.CONFIRMED)


def test_a_ratio_row_is_the_geometric_mean_with_its_back_transformed_interval() -> None:
    # per-seed ln ratios -1.2, -1.0, -1.4: mean -1.2, sd 0.2, se 0.2 / sqrt(3)
    t = _result("median_magnitude", [-1.2, -1.0, -1.4])
    se = 0.2 / math.sqrt(3)
    low, high = math.exp(-1.2 - T_975_2 * se), math.exp(-1.2 + T_975_2 * se)
    assert (round(low, 4), round(math.exp(-1.2), 4), round(high, 4)) == (0.1833, 0.3012, 0.495)
    ratio = t.ratio()
    assert (ratio.mean, ratio.low, ratio.high) == pytest.approx((math.exp(-1.2), low, high))
    assert estimate(t) == "x0.301 [0.183, 0.495] (ln -1.2)"
    assert t.one_sided_bound == pytest.approx(-1.2 + T_95_2 * se)  # the one-sided 95 % upper bound, ln scale
    assert "| < x0.422 |" in family_table(Evaluation((t,), ()))  # exp(-1.2 + 2.92 se) = 0.4220
    # a growth statistic is already an ln ratio: its mean difference, not exponentiated
    growth = _result("magnitude_growth", [-1.2, -1.0, -1.4])
    assert growth.ratio() is None and estimate(growth) == "-1.2 [-1.697, -0.703]"


def test_groups_are_geometric_means_over_the_confirmations_seeds_only(tmp_path: Path) -> None:
    pilot = confirm.load_pilot(write_pilot(tmp_path / "pilot"))
    plan = confirm.make_confirmation_plan(pilot, pilot.rate(), 12)
    # BHyT's last layer over seeds 4-8 spread over a factor of 10 (as LNS's is in the committed pilot), where an
    # arithmetic interval of 5 seeds reaches below 0
    magnitudes = {4: 30.0, 5: 3.0, 6: 300.0, 7: 10.0, 8: 5.0}
    runs = [
        layer_run(s, math.log(magnitudes[s.seed_index]) if s.group == "bhyt" else 2.0)
        for s in confirm.confirmation_specs(plan, pilot)
    ]
    runs += [layer_run(pilot_spec("bhyt", i), 9.0) for i in (1, 2, 3)]  # pilot seeds: never in a confirmation table
    assert stats.interval(list(magnitudes.values())).low < 0
    geometric = stats.geometric_mean(list(magnitudes.values()))
    text = groups_table(StudyRecord(KIND, {}, runs, plan=plan))
    row = next(line for line in text.splitlines() if line.startswith("| bhyt |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    from bhyt_pl.study.report.markdown import num

    spread = f"({num(3.0)}-{num(300.0)})"
    assert (
        cells[2] == "5/5"
        and cells[4] == f"{num(geometric.mean)} [{num(geometric.low)}, {num(geometric.high)}] {spread}"
    )
    ln = [math.log(v) for v in magnitudes.values()]
    assert geometric.low == pytest.approx(math.exp(stats.interval(ln).low)) and geometric.low > 0


def test_the_committed_report_rebuilds_from_its_record_byte_for_byte(tmp_path: Path) -> None:
    committed = ROOT / "docs" / "depth_study" / "confirmation"
    shutil.copy(committed / "results.json", tmp_path / "results.json")
    paths = write_report(tmp_path, load(tmp_path), figures=False)
    assert paths == {"report": tmp_path / "report.md"}
    assert paths["report"].read_text() == (committed / "report.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]
    assert (tmp_path / "results.json").read_bytes() == (committed / "results.json").read_bytes()  # read, not written


def test_the_header_prints_the_size_a_confirmation_holds(tmp_path: Path) -> None:
    committed = ROOT / "docs" / "depth_study" / "confirmation"
    record = load(committed)
    # deep-32x128 with RMSNorm: P = 32 x 196,608; + embedding 8192 x 128 + the gains 32 x 2 x 128 + 128
    size = RunSize(32, 6_291_456, 1_048_576, {"rmsnorm": 7_348_352}, 92_160, 933_888)
    meta = {**record.meta, "size": [size.to_dict()]}
    write_report(tmp_path, replace(record, meta=meta), figures=False)
    lines = (tmp_path / "report.md").read_text().splitlines()
    before = (committed / "report.md").read_text().splitlines()
    at = before.index("- loadavg at end: 1.92 2.00 1.99") + 1  # the meta's last entry, before the machine
    assert lines[at] == (
        "- parameters: 6,291,456 in block matrices (P), 7,348,352 in all, 1,048,576 embedding; tokens per run 92,160 "
        "= 0.0146 tokens per parameter (T/P)"
    )
    assert lines[:at] + lines[at + 1 :] == before


def test_the_report_holds_every_section_and_writes_no_record(tmp_path: Path) -> None:
    pilot = confirm.load_pilot(write_pilot(tmp_path / "pilot"))
    plan = confirm.make_confirmation_plan(pilot, pilot.rate(), 12)
    runs = [layer_run(s, 0.5 if s.group == "bhyt" else 2.0) for s in confirm.confirmation_specs(plan, pilot)]
    record = StudyRecord(KIND, {"command": "c", "rate": 3e-3}, runs, plan=plan)
    paths = write_report(tmp_path / "out", record, figures=False)
    text = paths["report"].read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.md"]
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## The primary family",
        "## Paper-level claims (intersection-union tests)",
        "## The frozen plan",
        "## Exploratory",
        "## Groups at the confirmation's rate",
        "## Over training (uncorrected, descriptive)",
    ]
    assert (
        "no claim is decided by them" in text and "seed indices 4..8, above every index the pilot used (0..3)" in text
    )
    assert "| BHyT < LNS: median_magnitude | lower | 0.003 | infeasible | the pilot's 80% interval" in text
    # every depth test at its three phases, numbered as the family; no test declared a phase but the end
    assert "### At initialisation, at the end, made by training" in text
    assert "No test here declared a phase other than the end before these runs" in text
    phases = text.split("### At initialisation, at the end, made by training", 1)[1].split("## ", 1)[0]
    rows = [line for line in phases.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(plan.primary) and rows[0].startswith(f"| 1 | {plan.primary[0].name} |")


def test_the_phases_note_follows_the_plans_declarations(tmp_path: Path) -> None:
    pilot = confirm.load_pilot(write_pilot(tmp_path / "pilot"))
    plan = confirm.make_confirmation_plan(pilot, pilot.rate(), 12)
    runs = [layer_run(s, 0.5 if s.group == "bhyt" else 2.0) for s in confirm.confirmation_specs(plan, pilot)]
    first = plan.primary[0]
    declared = replace(plan, tests=tuple(replace(t, phase="training") if t is first else t for t in plan.tests))
    text = write_report(tmp_path / "out", StudyRecord(KIND, {"command": "c"}, runs, plan=declared), figures=False)
    text = text["report"].read_text()
    assert "No test here declared a phase" not in text
    assert "Each test's verdict reads the phase it declared before these runs" in text


def test_docs_method_md_declares_the_family_the_code_builds_from_the_committed_pilot() -> None:
    """docs/method.md states the family before the confirmation's runs: its tables are the code's, rendered from the
    claims table and the plan the committed pilot gives at --max-seeds 13, and its counts are the plan's."""
    method = (ROOT / "docs" / "method.md").read_text()
    pilot = confirm.load_pilot(ROOT / "docs" / "depth_study")
    plan = confirm.make_confirmation_plan(pilot, pilot.rate(), 13)
    assert declared_family_table(plan) in method
    assert declared_rows_table() in method
    method = " ".join(method.split())  # the prose's sentences, whatever their line breaks
    assert plan.group_seeds == {"bhyt": 13, "rmsnorm": 13, "layernorm": 7, "peri_ln": 7, "bhyt_exact": 6}
    assert (
        "Seeds: bhyt 13, rmsnorm 13, layernorm 7, peri_ln 7, bhyt_exact 6, that is 46 runs on seed indices 4-16"
        in method
    )
    (claim,) = [c for c in plan.claims if c.primary]
    assert f"tests 1-3 as an intersection-union test; {claim.seeds} seeds for joint power 0.8" in method
    for max_seeds, tests, runs in ((12, 7, 34), (20, 8, 46), (21, 9, 68)):
        other = confirm.make_confirmation_plan(pilot, pilot.rate(), max_seeds)
        assert (other.family_size, other.runs) == (tests, runs), max_seeds
    assert (
        "at the default 12, BHyT's variance growth against RMSNorm needs 13 seeds and is dropped (7 tests, 34 runs)"
        in method
    )
    assert "at 21 the variance growth against LayerNorm joins (9 tests, 68 runs" in method

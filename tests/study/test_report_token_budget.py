"""The token-budget map's document (``bhyt_pl.study.report.token_budget``) from a record built by hand: its tables hold
the hand-computed numbers, an inheriting budget names its donor, the record's evaluated sections agree with the
report, and the document is rebuilt from the saved record alone, byte for byte."""

from __future__ import annotations

import json
import math
from pathlib import Path

from study_fixtures import budget_record

from bhyt_pl.study.record.results import load, save
from bhyt_pl.study.report.token_budget import crossovers, sections, write_report


def _section(report: str, title: str) -> str:
    return report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_loss_table_and_the_phases_hold_the_hand_numbers(tmp_path: Path) -> None:
    """BHyT - RMSNorm: -0.1 and +0.1 (mean 0); the ln median-token magnitude at step 0 is ln 1 - ln 2 on both seeds
    (-0.693, no spread), its made-by-training arm 0 and ln 2 (mean 0.347); early saturation 0.5 and 0.3 (0.4)."""
    write_report(tmp_path, budget_record(), figures=False)
    report = (tmp_path / "report.md").read_text()
    loss = _section(report, "Validation loss against rmsnorm")
    # -0.1 and +0.1: mean 0 (to rounding), half-width t_{0.975, 1} x 0.1414 / sqrt 2 = 1.271
    assert "| 0.015 | bhyt | 0.003 | 0.003 |" in loss and " [-1.271, 1.271] |" in loss and "| not decided |" in loss
    phases = _section(report, "Depth claims: at initialisation, at the end, made by training")
    row = next(line for line in phases.splitlines() if "median-token" in line)
    assert "| -0.693 [-0.693, -0.693] |" in row and "| 0.347 [" in row
    assert row.endswith("| present at initialisation, unresolved at the end |")
    saturation = _section(report, "Tanh saturation")
    assert "| 0.015 | bhyt | 10 | 0.4 [" in saturation and "mlp_in 0.400" in saturation
    assert "rmsnorm" not in saturation  # no bounded site: no row
    assert "6.5 nats" in report


def test_an_inheriting_budget_names_its_donor_and_the_rule(tmp_path: Path) -> None:
    write_report(tmp_path, budget_record((0.015, 0.05), select_through=1, shift=(0.0, 0.2)), figures=False)
    report = (tmp_path / "report.md").read_text()
    assert "| rmsnorm | 0.003 | 0.003 | 0.003 (from T/P 0.015) |" in report
    assert "each larger budget inherits the rate its group chose at T/P 0.015" in report


def test_the_crossover_section_reads_the_per_seed_lines(tmp_path: Path) -> None:
    """BHyT's differences: seed 1 -0.3 then +0.1, seed 2 -0.1 then +0.3 (shifts -0.2 and +0.2) at T/P 0.015 and 0.05:
    the mean line runs from -0.2 to +0.2 and crosses midway in ln T/P, at sqrt(0.015 x 0.05) = 0.0274; the two
    seeds' lines lie 0.2 apart, so their 95 % interval (half-width 12.706 x 0.1414 / sqrt 2 = 1.27) covers 0 over
    the whole range: not located."""
    record = budget_record((0.015, 0.05), shift=(-0.2, 0.2))
    [c] = crossovers(record.budgets, _effects(record)).values()
    assert c.slope == _approx(0.4 / math.log(0.05 / 0.015))
    assert c.estimate == _approx(math.sqrt(0.015 * 0.05)) and c.status == "crosses, not located"
    assert (c.low, c.high, c.open_low, c.open_high) == (_approx(0.015), _approx(0.05), True, True)
    write_report(tmp_path, record, figures=False)
    text = _section((tmp_path / "report.md").read_text(), "Where the difference changes sign")
    assert "| bhyt | none | 0.0274 | [0.015 or below, 0.05 or above] |" in text and "crosses, not located" in text


def _effects(record):
    from bhyt_pl.study.protocol.token_budget_effects import budget_effects

    return budget_effects(record.budgets, record.runs)


def _approx(value: float):
    import pytest

    return pytest.approx(value, rel=1e-9)


def test_the_rule_s_score_is_written_with_its_wrong_cells(tmp_path: Path) -> None:
    """Early saturation 0.4 >= 0.36 predicts a lower loss; with BHyT 0.2 higher (+0.1 and +0.3, mean +0.2, an
    interval that still covers 0 with two seeds) the one cell is scored wrong."""
    write_report(tmp_path, budget_record(shift=(0.2,)), figures=False)
    rule = _section((tmp_path / "report.md").read_text(), "The early-saturation rule")
    assert "Accuracy: 0 of 1 cells (0); no cell's interval excludes 0." in rule
    assert "| bhyt | 0.015 | 0.400 | lower | 0.2 [" in rule
    assert "Wrong: bhyt at T/P 0.015." in rule


def test_the_report_is_rebuilt_from_the_saved_record_alone(tmp_path: Path) -> None:
    record = budget_record((0.015, 0.05), shift=(0.0, 0.3))
    save(tmp_path, record, sections(record))
    paths = write_report(tmp_path, record)
    first = paths["report"].read_text()
    assert paths["figure"].is_file()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["kind"] == "token_budget" and [e["budget"] for e in saved["effects"]] == [0.015, 0.05]
    assert saved["saturation_rule"]["cut"] == 0.36
    write_report(tmp_path, load(tmp_path), figures=False)
    assert paths["report"].read_text() == first


def test_a_map_before_its_first_comparison_renders(tmp_path: Path) -> None:
    record = budget_record()
    record.runs = []
    record.budgets.selections.clear()
    write_report(tmp_path, record)
    report = (tmp_path / "report.md").read_text()
    assert "No budget has both the reference's and a scheme's evaluation runs yet." in report
    assert "| rmsnorm | 0.003 | pending |" in report

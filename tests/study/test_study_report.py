"""Report tables and figures read depth statistics at the matched rates, like the depth claims."""

from __future__ import annotations

import math
import re
from pathlib import Path

from study_fixtures import kept_design

from bhyt_pl.study.design import StudyRuns
from bhyt_pl.study.report import approximation_table, depth_runs, depth_runs_words
from bhyt_pl.study.runner import RunResult, RunSpec

T_975_2 = 4.302652729911275  # the 97.5% quantile of Student's t with 2 degrees of freedom

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

    table = approximation_table(StudyRuns(results), design, "bhyt_exact").splitlines()
    cells = [c.strip() for c in next(line for line in table if line.startswith("| bhyt |")).strip("|").split("|")]
    assert cells[1:5] == ["0.75", "n/a", "n/a", "n/a"]  # moment ratio at bhyt's best rate: layers 0-1 only
    read = {}
    for column, power in ((5, 1), (6, 2)):  # magnitude, variance (= magnitude squared / 10)
        lr, values = read[column] = _parse(cells[column])
        expected = _expected(MAGNITUDES[("bhyt", 3e-3)], MAGNITUDES[("bhyt_exact", 3e-3)], power)
        assert lr == 3e-3
        assert all(math.isclose(v, e, rel_tol=5e-3) for v, e in zip(values, expected, strict=True)), (values, expected)
    # at bhyt's best rate (1e-2) the magnitude ratio would be about 19: not what the table reads
    assert _expected(MAGNITUDES[("bhyt", 1e-2)], MAGNITUDES[("bhyt_exact", 3e-3)], 1)[0] > 15 > read[5][1][0]
    exact = [c.strip() for c in next(line for line in table if line.startswith("| bhyt_exact |")).strip("|").split("|")]
    assert exact[5:] == ["-", "-"]


def test_depth_figures_read_every_group_at_the_highest_matched_rate() -> None:
    results = StudyRuns(_run(g, lr, s, m[s - 1]) for (g, lr), m in MAGNITUDES.items() for s in (1, 2, 3))
    matched = kept_design({"bhyt": 1e-2}, matched_lrs=(1e-3, 3e-3))
    assert [(r.spec.lr, r.spec.seed_index) for r in depth_runs(results, matched, "bhyt")] == [
        (3e-3, s) for s in (1, 2, 3)
    ]
    assert depth_runs_words(matched) == "every scheme at lr 0.003 (matched)"
    unmatched = kept_design({"bhyt": 1e-2})
    assert [r.spec.lr for r in depth_runs(results, unmatched, "bhyt")] == [1e-2] * 3  # the best rate
    assert depth_runs(results, matched, "bhyt_exact") == []  # no selection yet


def test_report_from_rebuilds_the_committed_report_byte_for_byte(tmp_path) -> None:
    import json
    import shutil

    from bhyt_pl.study.command import report_from
    from bhyt_pl.study.results import load

    committed = Path(__file__).resolve().parents[2] / "docs" / "depth_study"
    shutil.copy(committed / "results.json", tmp_path / "results.json")
    report_from(tmp_path, figures=False)
    assert (tmp_path / "report.md").read_text() == (committed / "report.md").read_text()
    assert (tmp_path / "results.json").read_bytes() == (committed / "results.json").read_bytes()  # read, not written
    document = json.loads((committed / "results.json").read_text())
    design = load(committed).design.to_dict()  # the committed design predates its frame fields (read from meta)
    assert {k: v for k, v in design.items() if k in document["design"]} == document["design"]
    assert design["groups"] == document["meta"]["schemes"] and design["seeds"] == 3

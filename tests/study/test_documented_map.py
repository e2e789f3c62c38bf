"""The figures docs/token_budget.md quotes about the committed token-budget map, recomputed by hand from its record
(``docs/token_budget/results.json``): each budget's validation-loss difference to RMSNorm, paired per evaluation seed,
with its Student-t 95 % interval, and the minimum detectable difference at 80 % power from the two-sided paired
t-test's power integral. None of it calls the map's report or effects code; the committed report is also rebuilt
from the record alone, byte for byte."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
from scipy import integrate, optimize
from scipy import stats as scipy_stats

from bhyt_pl.study.record.results import StudyRecord, load
from bhyt_pl.study.report.token_budget import write_report

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "token_budget"
PAGE = ROOT / "docs" / "token_budget.md"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@pytest.fixture(scope="module")
def record() -> StudyRecord:
    return load(MAP)


def _losses(record: StudyRecord, group: str, steps: int, lr: float) -> dict[int, float]:
    return {
        r.spec.seed_index: r.val_loss
        for r in record.runs
        if r.spec.group == group and r.spec.steps == steps and r.spec.seed_index >= 1 and f"{r.spec.lr:g}" == f"{lr:g}"
    }


def _power(delta: float, sd: float, n: int) -> float:
    df, ncp = n - 1, delta * math.sqrt(n) / sd
    c = scipy_stats.t.ppf(0.975, df)

    def integrand(v: float) -> float:
        s = math.sqrt(v / df)
        return (scipy_stats.norm.cdf(ncp - c * s) + scipy_stats.norm.cdf(-ncp - c * s)) * scipy_stats.chi2.pdf(v, df)

    return integrate.quad(integrand, 0, math.inf)[0]


def _rows() -> list[list[str]]:
    text = PAGE.read_text().split("<!-- table: loss by budget -->", 1)[1].strip()
    lines = text.split("\n\n", 1)[0].splitlines()  # the table: its lines up to the first blank one
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _close(cell: str, value: float) -> None:
    """``cell``'s number written to its printed precision equals ``value``."""
    printed = NUMBER.search(cell).group(0)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    assert abs(float(printed) - value) <= 0.5 * 10**-decimals + 1e-12, (cell, value)


def test_the_page_s_loss_differences_are_the_records(record: StudyRecord) -> None:
    rows = _rows()
    assert len(rows) >= 15  # 5 budgets x 3 schemes
    for ratio, steps, scheme, lr, ref_lr, difference, mdd, pairs in (row[:8] for row in rows):
        a = _losses(record, scheme, int(steps.replace(",", "")), float(lr))
        b = _losses(record, "rmsnorm", int(steps.replace(",", "")), float(ref_lr))
        diffs = [a[i] - b[i] for i in sorted(set(a) & set(b))]
        n = len(diffs)
        assert n == int(pairs) >= 3
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = scipy_stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        low, high = NUMBER.findall(difference.split("[", 1)[1])[:2]
        _close(difference, mean)
        _close(low, mean - half)
        _close(high, mean + half)
        _close(mdd, optimize.brentq(lambda d: _power(d, sd, n) - 0.8, 1e-9, 20 * sd))


def test_the_committed_report_is_rebuilt_from_its_record_alone(tmp_path: Path) -> None:
    shutil.copy(MAP / "results.json", tmp_path / "results.json")
    write_report(tmp_path, load(tmp_path))
    assert (tmp_path / "report.md").read_bytes() == (MAP / "report.md").read_bytes()
    assert (tmp_path / "token_budget.png").read_bytes() == (MAP / "token_budget.png").read_bytes()

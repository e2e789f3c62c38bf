"""``python -m bhyt_pl study token-budget`` (``bhyt_pl.study.cli.token_budget``): bad options fail before any work,
naming the option; the dry run's steps, runs and GPU-hours per budget against hand computation; and a tiny map
through the shared driver: its record, reuse of every finished run, and its report rebuilt byte for byte."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bhyt_pl.config import LlamaConfig
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.study import main
from bhyt_pl.study.cli.driver import report_from
from bhyt_pl.study.cli.kinds import study_parser
from bhyt_pl.study.cli.token_budget import DEFAULTS, TOKEN_BUDGET, dry_run_text, setup_from
from bhyt_pl.study.record.results import load

TINY_MAP = [
    "token-budget",
    "--override", "n_layers=1",
    "--schemes", "rmsnorm", "bhyt",
    "--budgets", "0.005", "0.01",
    "--lrs", "3e-3",
    "--seeds", "2",
    "--extensions", "0",
    "--seq-len", "8",
    "--batch-size", "2",
    "--val-batches", "4",
    "--no-compile",
    "--workers", "1",
]  # fmt: skip
"""One layer of deep-16x64 (P = 49,152): 0.005 and 0.01 T/P of 16 tokens a step are 15.4 -> 15 and 30.7 -> 31 steps."""


def _setup(*argv: str):
    p = study_parser(TOKEN_BUDGET)
    return setup_from(p.parse_args(list(argv)), argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scheme-lrs", "dyt=1e-4"], "--scheme-lrs 'dyt=1e-4': must be GROUP=LR,LR,... with GROUP one of"),
        (["--scheme-lrs", "rmsnorm=fast"], "the rates must be numbers"),
        (["--reference", "layernorm"], "--reference 'layernorm' must be one of the --schemes groups"),
        (["--select-through", "6"], "--select-through must be between 1 and the 5 budgets"),
        (["--budgets", "0.015", "0.0151"], "round to the same number of steps"),
        (["--val-batches", "2"], "--val-batches must be >= 4"),
        (["--schemes", "rmsnorm", "nonorm"], "--schemes 'nonorm'"),
        (["--override", "n_layer=2"], "n_layer"),
    ],
)
def test_bad_options_fail_before_any_work_naming_the_option(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _setup(*argv)


def test_the_defaults_are_the_committed_map() -> None:
    setup = _setup()
    design = setup.design
    assert [g.label for g in design.groups] == ["rmsnorm", "bhyt", "bhyt_exact", "dyt:alpha_attn=0.5"]
    assert [(b.ratio, b.steps) for b in design.budgets] == [(0.015, 23), (0.043, 66), (0.12, 184), (0.35, 538),
                                                            (1.0, 1536)]  # fmt: skip
    assert design.grids["dyt:alpha_attn=0.5"] == (3e-5, 1e-4, 3e-4) and design.grids["bhyt"] == DEFAULTS.lrs
    assert design.select_through == 5 and design.n_seeds == 4 and setup.tokens_per_step == 512


def test_the_dry_run_per_budget_against_hand_computation(tmp_path: Path) -> None:
    """At T/P 1: 1,536 steps x 512 tokens = 786,432 tokens; runs: 4 groups x 3 rates on the selection seed + up to
    4 extensions + 4 groups x 4 seeds = 28 to 32; GPU-hours = runs x tokens x FLOPs a token / (0.4 x 989e12) /
    3600."""
    setup = _setup("--out", str(tmp_path / "map"))
    text = dry_run_text(setup)
    per_token = training_flops_per_token(LlamaConfig.from_name("deep-16x64"), 64)
    hours = [n * 786_432 * per_token / (0.4 * 989e12) / 3600 for n in (28, 32)]
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert row.startswith("| 1 | 1,536 | 786,432 | 77 | 28-32 |")
    assert f"| {hours[0]:.3g}-{hours[1]:.3g} |" in row and row.endswith("| 43,008-49,152 |")
    assert "runs: 140 to 160" in text and "786,432 in block matrices (P)" in text
    assert not (tmp_path / "map").exists()  # a dry run writes nothing


def test_a_tiny_map_runs_reuses_its_runs_and_rebuilds_its_report(tmp_path: Path) -> None:
    out = tmp_path / "map"
    assert main([*TINY_MAP, "--out", str(out)]) == 0
    record = load(out)
    design = record.budgets
    assert record.kind == "token_budget" and design is not None
    assert [(b.ratio, b.steps, b.early_step) for b in design.budgets] == [(0.005, 15, 10), (0.01, 31, 10)]
    # 2 groups x 1 rate on the selection seed + 2 groups x 2 seeds, on each budget
    assert len(record.runs) == 2 * (2 + 4)
    assert {r.tokens_per_param for r in record.runs if r.spec.steps == 31} == {31 * 16 / 49_152}
    assert all(len(r.val_batch_losses) == 4 for r in record.runs)
    # every evaluation run recorded its early step (10) for the saturation rule
    assert all(any(p["step"] == 10 for p in r.trajectory) for r in record.runs)
    saved = json.loads((out / "results.json").read_text())
    assert [e["group"] for e in saved["effects"]] == ["bhyt", "bhyt"]
    assert math.isfinite(saved["effects"][0]["val_loss_difference"]["mean"])
    assert "## Validation loss against rmsnorm" in (out / "report.md").read_text()
    assert (out / "token_budget.png").is_file()
    # the dry run replays the protocol on the finished runs: all 12 would be read back
    text = dry_run_text(_setup(*TINY_MAP[1:], "--out", str(out)))
    assert f"finished in {out} with the same settings, reused: 12" in text
    # the same command again trains nothing: every run is read back
    assert main([*TINY_MAP, "--out", str(out)]) == 0
    assert load(out).meta["runs_reused"] == 12
    report = (out / "report.md").read_text()
    # the shared --report-from rebuilds the document from results.json alone
    (out / "report.md").unlink()
    report_from(out)
    assert (out / "report.md").read_text() == report


def test_the_374m_recipe_resolves_to_its_budgets_on_a_cluster() -> None:
    """llama-374m: P = 16 x (1024 x 64 x (2 x 16 + 2 x 4) + 3 x 1024 x 4096) = 243,269,632; T/P 20 at 32 x 1024 tokens a
    step is 148,480 steps, 4.87B tokens; T/P 20 inherits its rate from T/P 6.3."""
    from bhyt_pl.study.cli.config_file import expand_config_files

    p = study_parser(TOKEN_BUDGET)
    argv = expand_config_files(p, ["--config", "recipes/study/token-budget-374m.yaml"])
    setup = setup_from(p.parse_args(argv), argv)
    design = setup.design
    assert setup.options.launcher == "slurm" and setup.settings.accelerator == "gpu"
    assert [b.ratio for b in design.budgets] == [0.2, 0.63, 2.0, 6.3, 20.0]
    assert design.budgets[-1].steps == 148_480 and design.budgets[-1].tokens(32 * 1024) == 4_865_392_640
    assert design.select_through == 4 and design.donor(design.budgets[-1]) is design.budgets[3]
    assert design.n_seeds == 3 and setup.val_batches == 32

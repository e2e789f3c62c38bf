"""The study's setup: what one invocation decides before any run trains, read by the command, the dry run, the
confirmation and the bench."""

from __future__ import annotations

import re
from pathlib import Path

from bhyt_pl.study.cli.exploration import FULL, QUICK, prepare
from bhyt_pl.study.cli.setup import StudySetup, loadavg_text


def test_the_mode_names_the_default_folder_and_out_overrides_it() -> None:
    assert prepare([]).mode == "study" and prepare([]).out == Path("runs/study")
    assert prepare(["--sweep", "--quick"]).out == Path("runs/study-sweep-quick")
    assert prepare(["--quick", "--out", "x"]).out == Path("x")


def test_meta_records_the_budget_the_runs_share(tmp_path: Path) -> None:
    setup: StudySetup = prepare(["--quick", "--steps", "7", "--batch-size", "3", "--out", str(tmp_path)])
    meta = setup.meta()
    assert meta["command"] == f"python -m bhyt_pl study --quick --steps 7 --batch-size 3 --out {tmp_path}"
    assert (meta["steps"], meta["tokens_per_step"]) == (7, 3 * QUICK.seq_len)
    assert meta["tokens_per_run"] == 7 * 3 * QUICK.seq_len and meta["n_layers_label"] == str(QUICK.layers)
    assert setup.base.steps == 7 and setup.config.n_layers == QUICK.layers
    assert prepare([]).design().lrs == FULL.lrs and prepare(["--sweep"]).design() is None


def test_the_load_average_is_three_numbers_or_says_it_has_none() -> None:
    text = loadavg_text()
    assert text == "n/a" or re.fullmatch(r"\d+\.\d+ \d+\.\d+ \d+\.\d+", text)

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


def test_meta_records_the_size_of_its_runs() -> None:
    # deep-32x128 at 8 layers (--quick): P = 8 x 196,608 = 1,572,864; embedding 8192 x 128; RMSNorm's gains
    # 8 x 2 x 128 + 128 = 2,176, Peri-LN's 8 x 2 x 128 more. 7 steps x 3 x 64 = 1,344 tokens. One pass over the
    # embedded corpus: 948,868 // 65 = 14,597 windows, 4,865 batches of 3 x 64 = 934,080 tokens.
    meta = prepare(["--quick", "--steps", "7", "--batch-size", "3", "--schemes", "rmsnorm", "peri_ln"]).meta()
    assert list(meta).index("size") == list(meta).index("tokens_per_run") + 1
    (size,) = meta["size"]
    assert (size["n_layers"], size["block_params"], size["embedding_params"]) == (8, 1_572_864, 1_048_576)
    assert size["total_params"] == {"rmsnorm": 2_623_616, "peri_ln": 2_625_664}
    assert size["tokens"] == 1344 and size["tokens_per_param"] == 1344 / 1_572_864
    assert (size["corpus_tokens"], size["unique_tokens"], size["epochs"]) == (934_080, 1344, 1344 / 934_080)


def test_the_load_average_is_three_numbers_or_says_it_has_none() -> None:
    text = loadavg_text()
    assert text == "n/a" or re.fullmatch(r"\d+\.\d+ \d+\.\d+ \d+\.\d+", text)

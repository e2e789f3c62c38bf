"""A two-test pytest session for tests/test_conftest.py (run on its own: its name keeps it out of the suite).

Both tests train in-process. The first announces in ``$CTRL_C_SUITE_DIR/training`` that training is under way
and then slows down, so that the outer test can press Ctrl-C (SIGINT to the process group); it trains through
the command line (``CTRL_C_SUITE_MODE=cli``: bhyt_pl saves and raises ``StoppedByCtrlC``) or through a plain
Lightning ``Trainer`` (``lightning``: Lightning catches ``KeyboardInterrupt`` and exits with 1). The second
writes ``$CTRL_C_SUITE_DIR/second`` when it runs, which it must not.
"""

from __future__ import annotations

import os
from pathlib import Path

from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks.checkpointing import RunCheckpoint
from bhyt_pl.cli import main
from bhyt_pl.module import LlamaLM
from distributed_jobs.signals import AnnounceAndSlow

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("CTRL_C_SUITE_DIR", "."))


def _fit(marker: Path) -> None:
    if os.environ.get("CTRL_C_SUITE_MODE") == "lightning":
        callbacks = [RunCheckpoint(dirpath=OUT / "ckpt", save_last=True), AnnounceAndSlow(str(marker), 2, 0.2)]
        trainer = quiet_trainer(callbacks=callbacks, enable_checkpointing=True, max_steps=500)
        trainer.fit(LlamaLM(overrides=TINY_OVERRIDES, seq_len=32), datamodule=TokenDataModule(n=10_000))
        return
    main([
        "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(OUT / "runs"),
        "--trainer.max_steps", "500", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2", "--model.overrides", "{n_layers: 1}",
        "--trainer.callbacks+", "distributed_jobs.signals.AnnounceAndSlow", "--trainer.callbacks.marker", str(marker),
        "--trainer.callbacks.after_step", "2", "--trainer.callbacks.seconds_per_step", "0.2",
    ])  # fmt: skip


def test_first_fit_is_interrupted() -> None:
    _fit(OUT / "training")


def test_second_fit_never_runs() -> None:
    (OUT / "second").write_text("ran")
    _fit(OUT / "training-second")

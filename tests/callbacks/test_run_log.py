"""RunLogFile: a fit's logging, warnings and stopping traceback go to ``<log_dir>/train.log`` as well, the
console keeps them, and nothing stays attached to Python's logging or warnings after the fit."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks.run_log import RunLogFile
from bhyt_pl.cli import main
from bhyt_pl.module import LlamaLM

ROOT = Path(__file__).resolve().parents[2]


class _Talks(L.Callback):
    """Logs through each route a run's messages take, at a known step; optionally fails there."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == 2:
            logging.getLogger("bhyt_pl.example").warning("a warning through logging")
            rank_zero_info("a line through Lightning's rank-zero logger")
            warnings.warn("a Python warning", UserWarning, stacklevel=1)
        if trainer.global_step == self.fail_at:
            raise RuntimeError("a bug at step 3")


def _fit(tmp_path: Path, callback: L.Callback) -> tuple[L.Trainer, RunLogFile]:
    log = RunLogFile()
    trainer = quiet_trainer(logger=CSVLogger(tmp_path), callbacks=[log, callback], max_steps=4)
    trainer.fit(LlamaLM(overrides=TINY_OVERRIDES, seq_len=32, warmup_steps=0), datamodule=TokenDataModule())
    return trainer, log


def _attached() -> list[str]:
    """Loggers that still hold a RunLogFile handler."""
    named = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    loggers = [logging.getLogger(), *named]
    return [lg.name for lg in loggers if any(type(h).__name__ == "_FileCopy" for h in lg.handlers)]


def test_logging_and_warnings_go_to_train_log_and_stay_on_the_console(tmp_path: Path, caplog) -> None:
    show_warning = warnings.showwarning
    with caplog.at_level(logging.INFO), pytest.warns(UserWarning, match="a Python warning"):
        trainer, log = _fit(tmp_path, _Talks())
    assert log.path == Path(trainer.logger.log_dir) / "train.log"
    text = log.path.read_text()
    for message in ("a warning through logging", "a line through Lightning's rank-zero logger"):
        assert text.count(message) == 1, text  # once, though a record can reach several loggers
        assert message in caplog.text  # the console's own routes still get them
    assert "WARNING bhyt_pl.example: a warning through logging" in text
    assert text.count("UserWarning: a Python warning") == 1  # and pytest.warns saw it: still shown
    assert _attached() == [] and warnings.showwarning is show_warning


def test_the_traceback_that_stops_a_fit_is_in_train_log(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="a bug at step 3"):
        _fit(tmp_path, _Talks(fail_at=3))
    (path,) = tmp_path.rglob("train.log")
    text = path.read_text()
    assert "Traceback (most recent call last):" in text and text.rstrip().endswith("RuntimeError: a bug at step 3")
    assert "a warning through logging" in text and _attached() == []


def test_a_resumed_run_appends_to_the_log_of_its_version(tmp_path: Path) -> None:
    """The command line adds RunLogFile to every run; a resume continues the version folder and its log."""
    args = ["fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(tmp_path), "--run_name", "r",
            "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false", "--data.init_args.seq_len",
            "16", "--data.init_args.batch_size", "2", "--model.overrides", "{n_layers: 1, dim: 32}"]  # fmt: skip
    main([*args, "--trainer.max_steps", "1"])
    main([*args, "--trainer.max_steps", "2", "--ckpt_path", "last"])
    text = (tmp_path / "r" / "version_0" / "train.log").read_text()
    assert text.count("bhyt_pl: finished at step") == 2 and "finished at step 2" in text

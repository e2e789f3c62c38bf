"""``StepProgressBar``: optimizer steps out of ``max_steps`` after any resume, mid-epoch ones included, and the run
folder's version as ``v_num`` beside other loggers."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from bhyt_pl.callbacks import StepProgressBar
from bhyt_pl.callbacks.checkpointing import StoppedByCtrlC
from bhyt_pl.cli import default_run_name, main
from bhyt_pl.runs import RunLogger

ROOT = Path(__file__).resolve().parents[2]
TINY = {"n_layers": 1, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "mlp_dim": 64}
RUN = default_run_name("tiny", "rmsnorm", TINY)

sys.path.insert(0, str(ROOT / "tests" / "distributed_jobs"))  # the signal callbacks a command line can name
from signals import SignalAt  # noqa: E402


def fit_args(runs: Path, steps: int, *extra: str) -> list[str]:
    """A tiny run of the embedded recipe, with the progress bar on (``StepProgressBar``, the CLI's default)."""
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(runs), "--trainer.max_steps", str(steps),
        "--checkpoint.every_n_train_steps", "5", "--trainer.limit_val_batches", "0",
        "--trainer.enable_model_summary", "false", "--data.init_args.seq_len", "16",
        "--data.init_args.batch_size", "2", "--model.overrides", str(TINY), *extra,
    ]  # fmt: skip


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"]


def resume(runs: Path, ckpt_path: Path, steps: int) -> StepProgressBar:
    """Continue from ``ckpt_path`` to ``steps``; the bar as it stood at the end."""
    cli = main(["fit", *fit_args(runs, steps, "--ckpt_path", str(ckpt_path))])
    assert cli.trainer.global_step == steps
    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, StepProgressBar)
    return bar


def assert_counts_steps(bar: StepProgressBar, resumed_at: int, steps: int) -> None:
    """It read ``Training: 7/?``: no total and no time left, as a mid-epoch resume skips on_train_epoch_start."""
    train = bar.train_progress_bar
    assert (train.n, train.total) == (steps, steps)
    assert train.initial == resumed_at  # the rate and time left count this run's steps only
    assert train.desc.startswith("Step")


def test_the_bar_counts_steps_after_resuming_a_periodic_save(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    main(["fit", *fit_args(runs, 8, "--checkpoint.save_top_k", "-1", "--trainer.enable_progress_bar", "false")])
    periodic = runs / RUN / "version_0" / "checkpoints" / "epoch=0-step=5.ckpt"
    assert saved_step(periodic) == 5
    assert_counts_steps(resume(runs, periodic, 9), 5, 9)


class _SigtermAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def _interrupted(runs: Path, callback: L.Callback, error: type[BaseException]) -> Path:
    cli = main(fit_args(runs, 12), run=False)
    cli.trainer.callbacks.insert(0, callback)
    with pytest.raises(error):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return runs / RUN / "version_0" / "checkpoints" / "last.ckpt"


def test_the_bar_counts_steps_after_resuming_a_sigterm_save(tmp_path: Path) -> None:
    last = _interrupted(tmp_path / "runs", _SigtermAt(6), SystemExit)  # Lightning's SIGTERMException
    assert saved_step(last) == 6
    assert_counts_steps(resume(tmp_path / "runs", last, 9), 6, 9)


def test_the_bar_counts_steps_after_resuming_a_ctrl_c_save(tmp_path: Path) -> None:
    last = _interrupted(tmp_path / "runs", SignalAt(7), StoppedByCtrlC)
    assert saved_step(last) == 7
    assert_counts_steps(resume(tmp_path / "runs", last, 10), 7, 10)


def test_v_num_is_the_run_folders_version_beside_other_loggers(tmp_path: Path) -> None:
    """With the W&B overlay the bar showed ``v_num=4ecf``: Lightning joins the loggers' versions ("3_a1b24ecf")
    and keeps the last four characters."""
    wandb = pytest.importorskip("lightning.pytorch.loggers").WandbLogger
    (tmp_path / "tiny-bhyt" / "version_2").mkdir(parents=True)
    (tmp_path / "tiny-bhyt" / "version_2" / "checkpoints").mkdir()
    run = RunLogger(str(tmp_path), name="tiny-bhyt", version=3)
    other = wandb(save_dir=str(tmp_path), id="a1b24ecf", offline=True)  # no W&B run starts: version is its id
    bar = StepProgressBar()
    trainer = L.Trainer(logger=[run, other], callbacks=[bar], max_steps=1)
    assert bar.get_metrics(trainer, None)["v_num"] == 3
    trainer = L.Trainer(logger=[other, run], callbacks=[StepProgressBar()], max_steps=1)  # order does not matter
    assert trainer.progress_bar_callback.get_metrics(trainer, None)["v_num"] == 3

"""RunCheckpoint in one process: Ctrl-C handling only when asked for (the command line asks), leftovers of
interrupted saves removed before the free-space check, the free space a sharded save needs, and a failed save
reported with the checkpoint that remains. (Multi-process saves: tests/test_distributed_checkpoints.py.)"""

from __future__ import annotations

import csv
import errno
import logging
import os
import shutil
import signal
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks.checkpointing import CheckpointSaveError, RunCheckpoint, StoppedByCtrlC, checkpoint_bytes
from bhyt_pl.checkpoint_io import AtomicCheckpointIO, checkpoint_step, human_size
from bhyt_pl.cli import main
from bhyt_pl.errors import UsageError
from bhyt_pl.module import LlamaLM

ROOT = Path(__file__).resolve().parents[2]
TINY = "{n_layers: 1, dim: 32, n_heads: 2, n_kv_heads: 1, mlp_dim: 64}"


def lm() -> LlamaLM:
    return LlamaLM(overrides=TINY_OVERRIDES, seq_len=32, warmup_steps=0)


class _SigintHandler(L.Callback):
    """Records the SIGINT handler in force during training."""

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.during = signal.getsignal(signal.SIGINT)


@pytest.mark.parametrize("opt_in", [False, True])
def test_ctrl_c_handling_is_opt_in(tmp_path: Path, opt_in: bool) -> None:
    """RunCheckpoint replaced SIGINT's handler in every Trainer it joined, so a user's own project (or a test
    suite) lost Lightning's Ctrl-C behaviour."""
    before, seen = signal.getsignal(signal.SIGINT), _SigintHandler()
    callback = RunCheckpoint(dirpath=tmp_path, save_last=True, save_on_ctrl_c=opt_in) if opt_in else RunCheckpoint(
        dirpath=tmp_path, save_last=True
    )  # fmt: skip
    quiet_trainer(callbacks=[callback, seen], enable_checkpointing=True, max_steps=2).fit(
        lm(), datamodule=TokenDataModule()
    )
    assert (seen.during == callback._on_ctrl_c) is opt_in
    assert (seen.during is before) is not opt_in
    assert signal.getsignal(signal.SIGINT) is before


def test_the_command_line_turns_ctrl_c_handling_on(tmp_path: Path) -> None:
    cli = main(["--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(tmp_path)], run=False)
    assert cli.trainer.checkpoint_callback.save_on_ctrl_c is True
    off = main(["--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(tmp_path),
                "--checkpoint.save_on_ctrl_c", "false"], run=False)  # fmt: skip
    assert off.trainer.checkpoint_callback.save_on_ctrl_c is False


def _fit_args(runs: Path, steps: int, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(runs), "--run_name", "run",
        "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar",
        "false", "--trainer.enable_model_summary", "false", "--data.init_args.seq_len", "16",
        "--data.init_args.batch_size", "2", "--model.overrides", TINY, *extra,
    ]  # fmt: skip


def test_leftovers_of_interrupted_saves_are_removed_before_the_free_space_check(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """Each kill during a save left a ``.last.ckpt.<random>.tmp`` that no later run removed (36 MB after one
    session), eating the space the free-space check counts. The disk here has room only once they are gone."""
    runs = tmp_path / "runs"
    main(_fit_args(runs, 2))
    folder = runs / "run" / "version_0" / "checkpoints"
    ours = {".last.ckpt.k2x9_q0a.tmp": 3_000_000, ".last.ckpt.zz01ab7c.tmp": 2_000_000}
    for name, size in ours.items():
        (folder / name).write_bytes(b"\0" * size)
    (folder / ".last.ckpt.step2.tmp").mkdir()  # an interrupted sharded save
    (folder / ".last.ckpt.step2.tmp" / "__0_0.distcp").write_bytes(b"\0" * 1_000_000)
    others = ["notes.tmp", ".last.ckpt.tmp", "keep.me"]
    for name in others:
        (folder / name).write_text("not ours")
    usage = namedtuple("usage", "total used free")
    disk_usage = shutil.disk_usage

    def room_once_cleaned(path):  # 6.5 MB free without the leftovers (a checkpoint needs 3.3 MB), 0.5 MB with
        held = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name.endswith((".tmp", ".distcp")))
        return usage(disk_usage(path).total, 0, 6_500_000 - held)

    monkeypatch.setattr(shutil, "disk_usage", room_once_cleaned)
    with caplog.at_level(logging.INFO):
        cli = main(_fit_args(runs, 3, "--ckpt_path", "last"))
    assert cli.trainer.global_step == 3 and checkpoint_step(folder / "last.ckpt") == 3
    assert sorted(p.name for p in folder.iterdir()) == sorted(["last.ckpt", *others])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("bhyt_pl: removed")]
    assert lines == [
        f"bhyt_pl: removed 3 leftover(s) of interrupted saves from {folder} (6.0 MB): .last.ckpt.k2x9_q0a.tmp, "
        f".last.ckpt.step2.tmp, .last.ckpt.zz01ab7c.tmp"
    ]


@pytest.mark.parametrize("previous", [0, 4_000, 10**9], ids=["none", "small", "whole"])
def test_a_sharded_save_needs_room_for_two_checkpoints(tmp_path: Path, monkeypatch, previous: int) -> None:
    """The previous folder stays until the new one is in place: two copies at once, one of which may be there."""
    module = lm()
    size = checkpoint_bytes(module)  # the weights and AdamW's two moments: 3 x 4 bytes per parameter
    assert size == 12 * sum(p.numel() for p in module.parameters()) + sum(b.numel() * 4 for b in module.buffers())
    on_disk = min(previous, size)  # a folder as large as one checkpoint stands for a whole previous one
    if previous:
        (tmp_path / "last.ckpt").mkdir()
        (tmp_path / "last.ckpt" / "__0_0.distcp").write_bytes(b"\0" * on_disk)
    need = 2 * size - on_disk
    usage = namedtuple("usage", "total used free")
    callback = RunCheckpoint(dirpath=tmp_path, save_last=True)

    def check(strategy, free: int) -> None:  # the check, as rank 0 of an unlaunched strategy runs it
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, free))
        callback.on_fit_start(SimpleNamespace(is_global_zero=True, strategy=strategy), module)

    fsdp2 = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    check(fsdp2, need)  # enough
    with pytest.raises(UsageError) as err:
        check(fsdp2, need - 1)
    assert str(err.value) == (
        f"not enough free disk space for checkpoints in {str(tmp_path)!r}: a sharded save keeps the previous "
        f"checkpoint until the new one is complete, so two checkpoints of about {human_size(size)} (the weights and "
        f"AdamW's two moments) need {human_size(need)} more, {human_size(need - 1)} is free; free space, or write "
        f"elsewhere with --runs_dir or --checkpoint.dirpath"
    )
    check(DDPStrategy(), size)  # one file: room for the checkpoint itself
    with pytest.raises(UsageError, match="one checkpoint needs about"):
        check(DDPStrategy(), size - 1)


def test_a_failed_save_names_the_step_the_cause_and_the_checkpoint_that_remains(tmp_path: Path, monkeypatch) -> None:
    """The writer's OSError surfaced as it was; under several processes the other ranks waited at the save's
    barrier. Now every rank raises CheckpointSaveError after the same save (here the only one)."""
    save = AtomicCheckpointIO.save_checkpoint

    def fails_at_step_2(self, checkpoint, path, storage_options=None):
        if checkpoint["global_step"] == 2:
            raise OSError(errno.EIO, "Input/output error", str(path))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", fails_at_step_2)
    callback = RunCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0, every_n_train_steps=1)
    trainer = quiet_trainer(callbacks=[callback], enable_checkpointing=True, max_steps=4,
                            plugins=[AtomicCheckpointIO()])  # fmt: skip
    with pytest.raises(CheckpointSaveError) as err:
        trainer.fit(lm(), datamodule=TokenDataModule())
    last = tmp_path / "last.ckpt"
    assert str(err.value) == (
        f"saving {last} at step 2 failed on rank 0 (OSError: [Errno 5] Input/output error: '{last}'); the previous "
        f"checkpoint {last} (step 1) is intact"
    )
    assert isinstance(err.value.__cause__, OSError) and (err.value.target, err.value.step) == (last, 2)
    assert torch.load(last, weights_only=False)["global_step"] == 1


class _Killed(Exception):
    """Stands for a kill: nothing of the run is saved after it (``save_on_exception`` is off)."""


class _KillAtValidation(L.Callback):
    """Strikes when the validation pass of optimizer step ``step`` starts: after every hook of that step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_start(self, trainer: L.Trainer, *args) -> None:
        if not trainer.sanity_checking and trainer.global_step == self.step:
            raise _Killed(f"killed before the validation of step {self.step}")


VALIDATE = ["--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "4",
            "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1",
            "--config", str(ROOT / "recipes" / "loggers" / "csv.yaml")]  # fmt: skip
"""Validation at steps 4 and 8 and at the last step, 10; every logged metric in a CSV file."""


class _SignalAt(L.Callback):
    """Sends this process ``signum`` at the end of optimizer step ``step`` (Ctrl-C's SIGINT, a preemption's SIGTERM)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def _logged(runs: Path) -> list[dict[str, dict[int, float]]]:
    """Per run (CSV log) in order: ``{"train/loss": {step: value}, "val/loss": {step: value}}`` by optimizer step
    (the CSV ``step`` column counts optimizer steps from 0)."""
    out = []
    for metrics in sorted((runs / "run" / "csv").glob("version_*/metrics.csv")):
        logged: dict[str, dict[int, float]] = {"train/loss": {}, "val/loss": {}}
        for row in csv.DictReader(metrics.open()):
            for name, values in logged.items():
                if row.get(name):
                    values[int(row["step"]) + 1] = float(row[name])
        out.append(logged)
    return out


def _joined(logs: list[dict[str, dict[int, float]]]) -> dict[str, dict[int, float]]:
    """What the runs logged, the later run's value where two logged the same step (a step trained again)."""
    return {name: {k: v for log in logs for k, v in log[name].items()} for name in ("train/loss", "val/loss")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, float]]:
    runs = tmp_path_factory.mktemp("uninterrupted")
    main(_fit_args(runs, 10, *VALIDATE))
    [logged] = _logged(runs)
    assert sorted(logged["val/loss"]) == [4, 8, 10] and sorted(logged["train/loss"]) == list(range(1, 11))
    return logged


@pytest.mark.slow
@pytest.mark.parametrize(
    ("every", "strike", "saved_at"),
    [
        (4, _KillAtValidation(8), 4),
        (5, _KillAtValidation(10), 5),
        (5, _SignalAt(8, signal.SIGINT), 8),
        (5, _SignalAt(8, signal.SIGTERM), 8),
    ],
    ids=["kill-periodic", "kill-final", "ctrl_c", "sigterm"],
)
def test_a_step_is_saved_after_its_validation_and_a_kill_during_it_is_made_good(
    tmp_path: Path, uninterrupted: dict[str, dict[int, float]], every: int, strike: L.Callback, saved_at: int
) -> None:
    """``last`` was saved at a step before that step's validation (Lightning's ModelCheckpoint saves in
    ``on_train_batch_end``): a kill during the validation left a checkpoint that Lightning resumes past it, so step
    8's ``val/loss`` was never logged ("kill-periodic"); at the last step the resumed run was complete with nothing
    to train, and the final ``val/loss`` was lost ("kill-final"); a Ctrl-C at step 8 saved and stopped before its
    validation, which was lost too ("ctrl_c"); a SIGTERM at step 8 saved after Lightning's validation pass, past the
    step's end, and the resumed run logged every metric one step late ("sigterm"). Now the step is saved right after
    its validation: a kill leaves the previous checkpoint and the resumed run trains the steps again and validates;
    a signal validates, then saves."""
    runs = tmp_path / "runs"
    args = _fit_args(runs, 10, *VALIDATE, "--checkpoint.every_n_train_steps", str(every))
    cli = main(args[1:], run=False)
    cli.trainer.callbacks.insert(0, strike)
    with pytest.raises((_Killed, StoppedByCtrlC, SystemExit)):  # SystemExit: Lightning's SIGTERMException
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    saved = checkpoint_step(runs / "run" / "version_0" / "checkpoints" / "last.ckpt")
    main([*args, "--ckpt_path", "last"])
    logs = _logged(runs)
    assert _joined(logs) == uninterrupted  # every step's losses, step 8's and step 10's validation among them
    assert saved == saved_at  # a kill during a step's validation leaves the checkpoint before that step
    assert min(logs[-1]["val/loss"]) > saved  # a saved step's validation had been made: not made again

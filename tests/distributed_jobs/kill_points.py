"""Test-only callbacks that stop a multi-process run at a chosen point of its steps, saves and validations, for
the kill matrix (tests/test_distributed_checkpoints.py). Each acts in its own process at a hook or inside the
function that ends at that point (patched there), so the kill lands at the same place on a fast idle machine and
on a slow loaded one; nothing of this is in the package.

``KillAt(point, step)`` acts at global step ``step``. The kills SIGKILL the whole process group (every rank of
the run at once, as a node failure or ``kill -9`` of the job):

- inside the save of step ``step`` (the save stages, ``SAVE_STAGES``):

  - ``after_rank1_shard``: rank 1's distributed-checkpoint writer returned (its shard is on disk);
  - ``after_metadata``: rank 0 wrote ``.metadata`` (the writer's ``finish``);
  - ``after_meta_pt``: rank 0 wrote Lightning's ``meta.pt``;
  - ``between_renames``: rank 0 moved the previous ``last.ckpt`` aside (the first of the two renames);

- during the validation of step ``step``, which comes before that step's save (``RunCheckpoint`` saves a step
  after its validation; the run resumes after ``step - 1`` and validates ``step`` again):

  - ``validation_start``: the validation pass of step ``step`` starts;
  - ``in_validation``: the first batch of that validation pass was evaluated on rank 0;

- after the final save is in place (the run is complete):

  - ``in_teardown``: the fit's teardown (every step trained, the final validation and save done).

Failures that stop the run by themselves:

- ``rank1_write_fails``: rank 1's distributed-checkpoint writer raises ``OSError(EIO)``;
- ``rank0_io_fails``: rank 0's ``CheckpointIO`` (DDP's single-file writer) raises ``OSError(EIO)``;
- ``rank0_disk_full``: the same writer finds no space left on the device (``OSError(ENOSPC)``);
- ``rank0_meta_pt_disk_full``: rank 0's ``meta.pt`` of a sharded save fills the disk: part of it is written, the
  free space (``shutil.disk_usage``) drops to 100 KB and torch's zip writer fails as it does then, without errno;
- ``rank1_dies``: rank 1 kills itself with SIGKILL at the start of the step, while rank 0 waits there outside
  any collective until Lightning's process watcher (polling every 5 s) stops it, at most ``hold`` seconds (a
  bound against a hang, not a timing); or, with ``hold=0`` and ``watcher=False``, rank 0 goes on into the
  step's first collective (the survivor's collective fails).

``<marker>``, when given, is written just before it strikes (``{"time": ..., "point": ...}``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from pathlib import Path

import lightning as L
import torch
from torch.distributed.checkpoint import FileSystemWriter

SAVE_STAGES = ("after_rank1_shard", "after_metadata", "after_meta_pt", "between_renames")
IN_VALIDATION = ("validation_start", "in_validation")
AFTER_SAVE = ("in_teardown",)
POINTS = (
    *SAVE_STAGES,
    *IN_VALIDATION,
    *AFTER_SAVE,
    "rank1_write_fails",
    "rank0_io_fails",
    "rank0_disk_full",
    "rank0_meta_pt_disk_full",
    "rank1_dies",
)


class KillAt(L.Callback):
    def __init__(self, point: str, step: int, marker: str | None = None, hold: float = 300.0, watcher: bool = True):
        if point not in POINTS:
            raise ValueError(f"point must be one of {POINTS}, got {point!r}")
        self.point, self.step, self.marker, self.hold, self.watcher = point, step, marker, hold, watcher

    def _now(self, trainer: L.Trainer) -> bool:
        return trainer.global_step == self.step

    def _validating_now(self, trainer: L.Trainer) -> bool:
        """The validation pass of step ``step`` within the fit (not the sanity check before training)."""
        return self._now(trainer) and trainer.state.fn == "fit" and not trainer.sanity_checking

    def _strike(self) -> None:
        if self.marker is not None:
            Path(self.marker).write_text(json.dumps({"time": time.time(), "point": self.point}))

    def _kill_group(self) -> None:
        self._strike()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        rank = trainer.global_rank
        if not self.watcher:
            from lightning.fabric.strategies.launchers import subprocess_script

            subprocess_script._ChildProcessObserver._run = lambda observer: False  # never acts
        point = self.point
        if point in ("after_rank1_shard", "rank1_write_fails") and rank == 1:
            write_data = FileSystemWriter.write_data

            def patched_write(writer, *args, **kwargs):
                if self._now(trainer) and point == "rank1_write_fails":
                    self._strike()
                    raise OSError(errno.EIO, "simulated write error on rank 1")
                result = write_data(writer, *args, **kwargs)
                if self._now(trainer):
                    self._kill_group()
                return result

            FileSystemWriter.write_data = patched_write
        elif point == "after_metadata" and rank == 0:
            finish = FileSystemWriter.finish

            def patched_finish(writer, *args, **kwargs):
                finish(writer, *args, **kwargs)
                if self._now(trainer):
                    self._kill_group()

            FileSystemWriter.finish = patched_finish
        elif point == "after_meta_pt" and rank == 0:
            save = torch.save

            def patched_save(obj, f, *args, **kwargs):
                save(obj, f, *args, **kwargs)
                if isinstance(f, (str, os.PathLike)) and Path(f).name == "meta.pt" and self._now(trainer):
                    self._kill_group()

            torch.save = patched_save
        elif point == "rank0_meta_pt_disk_full" and rank == 0:
            save = torch.save

            def full_disk_save(obj, f, *args, **kwargs):
                if isinstance(f, (str, os.PathLike)) and Path(f).name == "meta.pt" and self._now(trainer):
                    self._strike()
                    Path(f).write_bytes(b"PK\x03\x04 part of a zip")
                    usage = shutil.disk_usage(Path(f).parent)
                    shutil.disk_usage = lambda path: usage._replace(free=100_000)
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
                save(obj, f, *args, **kwargs)

            torch.save = full_disk_save
        elif point == "between_renames" and rank == 0:
            rename = os.rename

            def patched_rename(src, dst, *args, **kwargs):
                rename(src, dst, *args, **kwargs)
                if Path(src).name == "last.ckpt" and Path(dst).name == ".last.ckpt.previous" and self._now(trainer):
                    self._kill_group()

            os.rename = patched_rename
        elif point in ("rank0_io_fails", "rank0_disk_full") and rank == 0:
            io = trainer.strategy.checkpoint_io
            save_checkpoint = io.save_checkpoint

            def failing_save(checkpoint, path, *args, **kwargs):
                if self._now(trainer):
                    self._strike()
                    if point == "rank0_disk_full":
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                    raise OSError(errno.EIO, "simulated write error on rank 0")
                return save_checkpoint(checkpoint, path, *args, **kwargs)

            io.save_checkpoint = failing_save

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        # global_step counts finished steps: step k starts with global_step == k - 1
        if self.point != "rank1_dies" or trainer.global_step != self.step - 1:
            return
        if trainer.global_rank == 1:
            self._strike()
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.hold:
            time.sleep(self.hold)  # the watcher ends this process when it sees rank 1 gone; ``hold`` bounds a hang

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.point == "validation_start" and trainer.global_rank == 0 and self._validating_now(trainer):
            self._kill_group()

    def on_validation_batch_end(self, trainer: L.Trainer, *args) -> None:
        if self.point == "in_validation" and trainer.global_rank == 0 and self._validating_now(trainer):
            self._kill_group()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.point == "in_teardown" and stage == "fit" and trainer.global_rank == 0 and self._now(trainer):
            self._kill_group()


class RecordPid(L.Callback):
    """Writes ``<out_dir>/pid<rank>`` at setup: the test checks that every rank's process ended."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"pid{trainer.global_rank}").write_text(str(os.getpid()))

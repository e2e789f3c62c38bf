"""``RunCheckpoint``: Lightning's ``ModelCheckpoint`` made to lose no work.

Lightning's callback writes ``last`` at the end of training only when no ``last`` was written earlier
in the run, so with ``every_n_train_steps=N`` the final ``max_steps % N`` steps are never saved; and an
interrupted run (SIGTERM from a cluster's preemption, Ctrl-C) keeps only the previous save. This
subclass always saves ``last`` at the final step and at the step an interruption stopped the run,
checks before training that the checkpoint folder is writable, gives every rank the run version rank 0
claimed (``RunLogger``), and prints where logs and checkpoints go at the start and the end.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from bhyt_pl.errors import UsageError
from bhyt_pl.runs import RunLogger

__all__ = ["RunCheckpoint"]


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that always saves ``last`` at the final step and on SIGTERM / Ctrl-C.

    Takes ``ModelCheckpoint``'s arguments (``--checkpoint.*`` on the command line). Interruptions save
    ``last`` at the step the run stopped, so ``--ckpt_path last`` continues from there: SIGTERM (Lightning
    stops every rank after the same completed step, the process exits with status 0) and Ctrl-C (the
    current optimizer step finishes, on every rank, then the run ends normally; a second Ctrl-C aborts
    without saving). Other exceptions follow ``save_on_exception`` as in Lightning (a crashed step's
    state is not trusted by default).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[RunCheckpoint(save_last=True, every_n_train_steps=5)], max_steps=12)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_saved_at: int | None = None
        """Global step of the ``last`` checkpoint written in this run (None: none yet)."""
        self._start_step = 0
        self._ctrl_c = False
        self._previous_sigint: Any = None

    @property
    @override
    def state_key(self) -> str:
        # keep ModelCheckpoint's key so checkpoints written before this subclass restore its state
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = trainer.logger
        if isinstance(logger, RunLogger):  # rank 0 claimed the version folder; every rank writes there
            logger.adopt_version(trainer.strategy.broadcast(logger.version if trainer.is_global_zero else None))
        super().setup(trainer, pl_module, stage)
        if stage == TrainerFn.FITTING and self.dirpath is not None:
            problem = self._check_writable(str(self.dirpath)) if trainer.is_global_zero else None
            problem = trainer.strategy.broadcast(problem)
            if problem:
                raise UsageError(problem)

    @staticmethod
    def _check_writable(dirpath: str) -> str | None:
        """Why checkpoints cannot be written to ``dirpath``, or None (found before training, not at the first save)."""
        if "://" in dirpath:
            return None  # remote storage: its own client reports errors
        try:
            os.makedirs(dirpath, exist_ok=True)
            with tempfile.TemporaryFile(dir=dirpath):
                pass
        except OSError as err:
            return (
                f"cannot write checkpoints to {dirpath!r}: {err.strerror or err}; "
                f"make it writable, or choose another folder with --runs_dir or --checkpoint.dirpath"
            )
        return None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_step = trainer.global_step
        self._ctrl_c = False
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_ctrl_c)
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        rank_zero_info(f"bhyt_pl: logs in {log_dir}, checkpoints in {self.dirpath}")

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        """First Ctrl-C: stop after the current optimizer step and save ``last``; a second one aborts.

        Stopping at a step boundary (rather than wherever ``KeyboardInterrupt`` lands, possibly inside
        the optimizer update or after the next batch was drawn) keeps weights and data position exact."""
        if self._ctrl_c:
            raise KeyboardInterrupt
        self._ctrl_c = True
        rank_zero_info("\nbhyt_pl: Ctrl-C: finishing this step, then saving last and stopping (Ctrl-C again aborts)")

    def _restore_sigint(self) -> None:
        previous = getattr(self, "_previous_sigint", None)
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)
        self._previous_sigint = None

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: stop only after a whole optimizer step
        stop = self._ctrl_c
        if trainer.world_size > 1:  # every rank stops after the same step
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop and not trainer.should_stop:
            self._ctrl_c = True
            trainer.should_stop = True

    @override
    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if self.save_last and not self.last_model_path:
            # the folder is this run version's own: ``last.ckpt`` is ours to replace. Lightning writes
            # ``last-v1.ckpt`` beside an existing one when it cannot tell (e.g. a resumed run whose
            # folder was moved), and ``--ckpt_path last`` would then find an older file
            self.last_model_path = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_saved_at = trainer.global_step

    def save_last_now(self, trainer: L.Trainer) -> bool:
        """Write ``last`` at the current step unless it is already there; True if written."""
        if (
            not self.save_last
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.sanity_checking
            or trainer.global_step == self._last_saved_at
            or trainer.global_step <= self._start_step  # nothing trained since the run (or resume) began
        ):
            return False
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        return True

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()
        # Lightning's version saves only if no ``last`` was written in this run: the final steps would be lost
        self.save_last_now(trainer)
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        where = self.last_model_path or self.dirpath
        if self._ctrl_c:
            rank_zero_info(f"bhyt_pl: stopped by Ctrl-C at step {trainer.global_step}; saved {where}; "
                           f"resume with --ckpt_path last")  # fmt: skip
        rank_zero_info(f"bhyt_pl: finished at step {trainer.global_step}; last checkpoint {where}; logs in {log_dir}")

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_sigint()
        if not isinstance(exception, SIGTERMException):
            super().on_exception(trainer, pl_module, exception)
            return
        # Lightning raises SIGTERMException on every rank after the same completed step
        if self.save_last_now(trainer) or trainer.global_step == self._last_saved_at:
            rank_zero_info(
                f"bhyt_pl: stopped by SIGTERM at step {trainer.global_step}; saved {self.last_model_path}; "
                f"resume with --ckpt_path last"
            )

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_sigint()
        super().teardown(trainer, pl_module, stage)

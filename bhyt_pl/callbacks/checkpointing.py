"""``RunCheckpoint``: Lightning's ``ModelCheckpoint`` made to lose no work.

Lightning's callback writes ``last`` at the end of training only when no ``last`` was written earlier
in the run, so with ``every_n_train_steps=N`` the final ``max_steps % N`` steps are never saved; and an
interrupted run (SIGTERM from a cluster's preemption, Ctrl-C, SLURM's requeue signal) keeps only the
previous save. This subclass always saves ``last`` at the final step and at the step an interruption
stopped the run, checks before training that the checkpoint folder is writable, gives every rank the
run version rank 0 claimed (``RunLogger``), and prints where logs and checkpoints go at the start and the end.

Signals (README, "Stopping and resuming"):

- SIGTERM: Lightning stops every rank after the same step; ``last`` is saved there; exit status 0.
- Ctrl-C (SIGINT): the current optimizer step finishes on every rank, ``last`` is saved at once (no
  validation pass), one line is printed and ``StoppedByCtrlC`` ends the run: exit status 130. A second
  Ctrl-C aborts without saving.
- SLURM's requeue signal (SIGUSR1 unless ``SLURMEnvironment(requeue_signal=...)``, with ``auto_requeue``):
  replaces Lightning's handler, which saved ``hpc_ckpt_N.ckpt`` wherever the signal landed (possibly
  mid-step) into ``default_root_dir`` and kept training. Here the current step finishes, ``last`` is
  saved, rank 0 runs ``scontrol requeue <job>`` and ``Requeued`` ends the process with status 0; the
  requeued job (``SLURM_RESTART_COUNT`` > 0) resumes from ``last`` without ``--ckpt_path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
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

__all__ = ["Requeued", "RunCheckpoint", "StoppedByCtrlC", "checkpoint_bytes", "slurm_job_id"]


def checkpoint_bytes(pl_module: L.LightningModule) -> int:
    """Estimated size of one full checkpoint: the parameters and buffers plus AdamW's two moments (each the
    size of its parameter) for every trainable parameter. Global sizes under FSDP2 (a DTensor's ``numel`` is
    its global one). Read from the tensors, not from ``state_dict()``: under FSDP1 that is a collective, and
    only rank 0 asks (FSDP1's flat shards make this a per-rank lower bound there)."""
    params = list(pl_module.parameters())
    state = sum(t.numel() * t.element_size() for t in [*params, *pl_module.buffers()])
    moments = sum(2 * p.numel() * p.element_size() for p in params if p.requires_grad)
    return state + moments


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class StoppedByCtrlC(Exception):
    """The run stopped on Ctrl-C after saving ``last``: the command line exits with status 130 (128 + SIGINT)."""


class Requeued(SystemExit):
    """The run saved ``last`` on SLURM's requeue signal and asked SLURM to requeue the job: exit status 0."""

    def __init__(self) -> None:
        super().__init__(0)


def slurm_job_id() -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for an array task, else ``SLURM_JOB_ID``."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def _requeue_signal(trainer: L.Trainer) -> int | None:
    """The signal SLURM sends before a job's time limit, when Lightning runs under SLURM with auto-requeue."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal
    return None


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that always saves ``last`` at the final step and on SIGTERM / Ctrl-C / SLURM requeue.

    Takes ``ModelCheckpoint``'s arguments (``--checkpoint.*`` on the command line). Interruptions save
    ``last`` at the step the run stopped, so ``--ckpt_path last`` continues from there (module docstring:
    exit statuses and SLURM). Other exceptions follow ``save_on_exception`` as in Lightning (a crashed
    step's state is not trusted by default).

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
        self._requeue = False
        self._previous_handlers: dict[int, Any] = {}

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
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A full disk is found here, before any work, rather than at the first save."""
        super().on_fit_start(trainer, pl_module)
        if self.dirpath is None or "://" in str(self.dirpath) or not (self.save_last or self.save_top_k):
            return
        problem = None
        if trainer.is_global_zero:
            need = checkpoint_bytes(pl_module)
            free = shutil.disk_usage(self.dirpath).free
            if free < need:
                problem = (
                    f"not enough free disk space for checkpoints in {str(self.dirpath)!r}: one checkpoint needs "
                    f"about {_size(need)} (the weights and AdamW's two moments), {_size(free)} is free; free "
                    f"space, or write elsewhere with --runs_dir or --checkpoint.dirpath"
                )
        problem = trainer.strategy.broadcast(problem)
        if problem:
            raise UsageError(problem)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_step = trainer.global_step
        self._ctrl_c = self._requeue = False
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_ctrl_c)
            requeue = _requeue_signal(trainer)
            if requeue is not None:  # replaces Lightning's handler (set when the run started)
                self._previous_handlers[requeue] = signal.signal(requeue, self._on_requeue_signal)
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        rank_zero_info(f"bhyt_pl: logs in {log_dir}, checkpoints in {self.dirpath}")

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        """First Ctrl-C: stop after the current optimizer step and save ``last``; a second one aborts.

        Stopping at a step boundary (rather than wherever ``KeyboardInterrupt`` lands, possibly inside
        the optimizer update or after the next batch was drawn) keeps weights and data position exact."""
        if self._ctrl_c:
            raise KeyboardInterrupt
        self._ctrl_c = True

    def _on_requeue_signal(self, signum: int, frame: Any) -> None:
        """SLURM's warning before the time limit: stop after the current step, save ``last``, requeue."""
        self._requeue = True

    def _restore_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous_handlers.items():
                if previous is not None:
                    signal.signal(signum, previous)
        self._previous_handlers = {}

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: stop only after a whole optimizer step
        ctrl_c, stop = self._ctrl_c, self._ctrl_c or self._requeue
        if trainer.world_size > 1:  # every rank stops after the same step; one collective on a normal step
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
            if stop:  # every rank is here: which signal (Ctrl-C wins, as on one process)
                ctrl_c = trainer.strategy.reduce_boolean_decision(ctrl_c, all=False)
        if not stop:
            return
        self.save_last_now(trainer)
        where = self.last_model_path or self.dirpath
        if ctrl_c:
            rank_zero_info(f"bhyt_pl: stopped by Ctrl-C at step {trainer.global_step}; saved {where}; "
                           f"resume with --ckpt_path last")  # fmt: skip
            raise StoppedByCtrlC(f"stopped by Ctrl-C at step {trainer.global_step}")
        job = slurm_job_id()
        requeued = True
        if trainer.is_global_zero:
            if job is None:
                requeued, outcome = False, "no SLURM job id in the environment, so nothing to requeue"
            else:
                result = subprocess.call(["scontrol", "requeue", job])
                requeued = result == 0
                outcome = f"requeued SLURM job {job}" if requeued else f"`scontrol requeue {job}` failed ({result})"
            rank_zero_info(f"bhyt_pl: SLURM requeue signal at step {trainer.global_step}; saved {where}; {outcome}"
                           + ("; the requeued job resumes from it" if requeued else "; resume with --ckpt_path last"))
        if trainer.world_size > 1:  # every rank exits with rank 0's outcome
            requeued = trainer.strategy.broadcast(requeued)
        if not requeued:  # a failed requeue must not look like success to the scheduler
            raise SystemExit(1)
        raise Requeued

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
        self._restore_signals()
        # Lightning's version saves only if no ``last`` was written in this run: the final steps would be lost
        self.save_last_now(trainer)
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        where = self.last_model_path or self.dirpath
        rank_zero_info(f"bhyt_pl: finished at step {trainer.global_step}; last checkpoint {where}; logs in {log_dir}")

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore_signals()
        if isinstance(exception, (StoppedByCtrlC, Requeued)):
            return  # saved and reported at the step boundary
        logger = trainer.logger
        if isinstance(logger, RunLogger) and trainer.global_step == 0 and logger.discard():
            # failed before its first step: no orphan version_N (a log and config.yaml) for the next run to skip
            rank_zero_info(f"bhyt_pl: the run failed before its first step; removed its folder {logger.log_dir}")
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
        self._restore_signals()
        super().teardown(trainer, pl_module, stage)

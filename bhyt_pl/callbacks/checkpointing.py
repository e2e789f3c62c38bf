"""``RunCheckpoint``: Lightning's ``ModelCheckpoint`` made to lose no work.

Lightning's callback writes ``last`` at the end of training only when no ``last`` was written earlier
in the run, so with ``every_n_train_steps=N`` the final ``max_steps % N`` steps are never saved; and an
interrupted run (SIGTERM from a cluster's preemption, Ctrl-C, SLURM's requeue signal) keeps only the
previous save. This subclass always saves ``last`` at the final step and at the step an interruption
stopped the run, checks before training that the checkpoint folder is writable and has room, removes what
interrupted saves of earlier runs left there, gives every rank the run version rank 0 claimed
(``RunLogger``), and prints where logs and checkpoints go at the start and the end.

A step's validation belongs to the step: at a step after which Lightning validates (``val_check_interval``, the
final step's ``ValidateAtLastStep``), every save of that step is made once the validation has ended
(``on_validation_end``, after its metrics are logged) instead of before it. Lightning resumes a checkpoint saved
before a validation as if that validation had run; one killed during it was lost for good. Now a kill during
it leaves the previous checkpoint, and the resumed run trains the step again and validates it.

Every save is atomic and agreed on (docs/checkpoints.md):

- a sharded checkpoint (FSDP2, FSDP1 ``state_dict_type="sharded"``), which Lightning writes in place, is
  written to a temporary folder named after the step, completed with a marker and moved into place by rank 0
  (``bhyt_pl.checkpoint_io.commit_sharded_checkpoint``); a single file is written atomically by
  ``AtomicCheckpointIO`` (the command line's default ``trainer.plugins``);
- a save that fails on one rank fails on every rank after the same save: each raises ``CheckpointSaveError``
  naming the failing rank, and the previous checkpoint is intact. (Lightning's ``Trainer.save_checkpoint``
  ends with a barrier: a rank that raised before it left the others waiting for the process-group timeout.)

Signals (docs/how-to/resume.md, "Signals"):

- SIGTERM: Lightning stops every rank after the same step (and after that step's validation, when one is
  due there); ``last`` is saved there; exit status 0.
- Ctrl-C (SIGINT), with ``save_on_ctrl_c=True`` (the command line's default): the current optimizer step
  finishes on every rank, ``last`` is saved at once (no extra validation pass; only a validation due at that
  very step runs first, as it belongs to the step), one line is printed and ``StoppedByCtrlC`` ends the run:
  exit status 130. A second Ctrl-C aborts without saving. Without it (the default in your own ``Trainer``),
  Lightning's behaviour: ``KeyboardInterrupt`` wherever it lands, no save.
- SLURM's requeue signal (SIGUSR1 unless ``SLURMEnvironment(requeue_signal=...)``, with ``auto_requeue``):
  replaces Lightning's handler, which saved ``hpc_ckpt_N.ckpt`` wherever the signal landed (possibly
  mid-step) into ``default_root_dir`` and kept training. Here the current step finishes (with its validation,
  when one is due there), ``last`` is saved, rank 0 runs ``scontrol requeue <job>`` and ``Requeued`` ends the
  process with status 0; the requeued job (``SLURM_RESTART_COUNT`` > 0) resumes from ``last`` without
  ``--ckpt_path``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from bhyt_pl.checkpoint_io import (
    checkpoint_problem,
    checkpoint_step,
    commit_sharded_checkpoint,
    human_size,
    newest_complete_beside,
    remove_checkpoint_path,
    remove_leftovers,
    saves_sharded,
    temporary_path,
)
from bhyt_pl.disk_full import save_disk_full
from bhyt_pl.errors import AgreedUsageError
from bhyt_pl.runs import RunLogger

__all__ = [
    "CheckpointSaveError",
    "Requeued",
    "RunCheckpoint",
    "StoppedByCtrlC",
    "checkpoint_bytes",
    "slurm_job_id",
    "validation_follows",
]


def checkpoint_bytes(pl_module: L.LightningModule) -> int:
    """Estimated size of one full checkpoint: the parameters and buffers plus AdamW's two moments (each the
    size of its parameter) for every trainable parameter. Global sizes under FSDP2 (a DTensor's ``numel`` is
    its global one). Read from the tensors, not from ``state_dict()``: under FSDP1 that is a collective, and
    only rank 0 asks (FSDP1's flat shards make this a per-rank lower bound there)."""
    params = list(pl_module.parameters())
    state = sum(t.numel() * t.element_size() for t in [*params, *pl_module.buffers()])
    moments = sum(2 * p.numel() * p.element_size() for p in params if p.requires_grad)
    return state + moments


class StoppedByCtrlC(Exception):
    """The run stopped on Ctrl-C after saving ``last``: the command line exits with status 130 (128 + SIGINT)."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed on at least one rank. Every rank raises it after the same save; the previous
    checkpoint is intact. The cause of the failing rank is chained (``__cause__``) on that rank."""

    def __init__(self, message: str, target: Path, step: int, kept: str) -> None:
        super().__init__(message)
        self.target, self.step = target, step
        self.kept = kept
        """What remains: ``the previous checkpoint <path> (step N) is intact`` or that none was saved."""


class Requeued(SystemExit):
    """The run saved ``last`` on SLURM's requeue signal and asked SLURM to requeue the job: exit status 0."""

    def __init__(self) -> None:
        super().__init__(0)


@contextmanager
def _failures_recorded(strategy: Strategy, failures: list[BaseException]) -> Iterator[None]:
    """Inside: ``strategy.save_checkpoint`` records its exception in ``failures`` instead of raising, so that
    ``Trainer.save_checkpoint`` still reaches its closing barrier on this rank (DDP writes on rank 0 while the
    others wait there: a raise on rank 0 left them waiting for the process-group timeout)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: every rank raises it

    save = strategy.save_checkpoint
    shadowed = "save_checkpoint" in vars(strategy)

    def recording(*args: Any, **kwargs: Any) -> None:
        try:
            save(*args, **kwargs)
        except (Exception, CheckpointException) as err:
            failures.append(err)

    strategy.save_checkpoint = recording  # an instance attribute shadows the method for this one save
    try:
        yield
    finally:
        if shadowed:
            strategy.save_checkpoint = save
        else:
            del strategy.save_checkpoint


def _failed_ranks(trainer: L.Trainer, failures: list[BaseException]) -> list[tuple[int, str]]:
    """``(rank, cause)`` of every rank whose save failed, the same list on every rank (a collective)."""
    import torch.distributed as dist

    local = [item for err in failures for item in _causes(err, trainer.global_rank)]
    if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return local
    if not trainer.strategy.reduce_boolean_decision(bool(local), all=False):
        return []
    gathered: list[Any] = [None] * trainer.world_size
    dist.all_gather_object(gathered, local)
    found = sorted({item for items in gathered for item in items})
    return found


def _causes(err: BaseException, rank: int) -> list[tuple[int, str]]:
    """A failed save's ranks and causes in one line each; torch's distributed checkpoint gathers every rank's
    failure into one ``CheckpointException`` raised on all ranks."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        return [(int(r), _one_line(exc[0] if isinstance(exc, tuple) else exc)) for r, exc in failures.items()]
    return [(rank, _one_line(err))]


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def _bytes_on_disk(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size if path.is_file() else 0


def slurm_job_id() -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for an array task, else ``SLURM_JOB_ID``."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the current training batch, asked in ``on_train_batch_end``.

    The training loop decides it once every ``on_train_batch_end`` has run (``_TrainingEpochLoop.on_advance_end``)
    with ``_should_check_val_fx``: the validation interval, the end of an epoch, ``trainer.should_stop`` (set by
    then by ``ValidateAtLastStep``, which runs before checkpoint callbacks). Lightning has no public API for this
    decision, and a copy of its rules would drift from them, so the loop's own method is asked (lightning is pinned
    to 2.6 in pyproject.toml; tests/callbacks/test_checkpointing.py fails if the answer changes)."""
    loop = trainer.fit_loop
    fetcher = loop._data_fetcher
    return fetcher is not None and loop.epoch_loop._should_check_val_fx(fetcher)


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
    step's state is not trusted by default). At a step followed by a validation, the step's saves (and a stop
    asked for by a signal) wait for the end of that validation, so that no checkpoint skips a validation that
    never completed (module docstring).

    Args:
        save_on_ctrl_c: Handle Ctrl-C (SIGINT): finish the current optimizer step on every rank, save ``last``
            and raise ``StoppedByCtrlC``. Off by default, so a ``Trainer`` of your own keeps Lightning's
            behaviour; the command line turns it on.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[RunCheckpoint(save_last=True, every_n_train_steps=5)], max_steps=12)
        >>> trainer = L.Trainer(callbacks=[RunCheckpoint(save_last=True, save_on_ctrl_c=True)], max_steps=12)
    """

    def __init__(self, *args: Any, save_on_ctrl_c: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_on_ctrl_c = save_on_ctrl_c
        self._last_saved_at: int | None = None
        """Global step of the ``last`` checkpoint written in this run (None: none yet)."""
        self._start_step = 0
        self._ctrl_c = False
        self._requeue = False
        self._previous_handlers: dict[int, Any] = {}
        self._step_end: tuple[int, Any, Any, int] | None = None
        """``(step, outputs, batch, batch_idx)`` of a step whose saves wait for its validation."""
        self._stop_after_validation: bool | None = None
        """A signal's stop waiting for the validation of the step it came at: True for Ctrl-C, False for requeue."""

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
                raise AgreedUsageError(problem)
            if trainer.is_global_zero and "://" not in str(self.dirpath):
                self._remove_leftovers(trainer)

    def _remove_leftovers(self, trainer: L.Trainer) -> None:
        """Delete what interrupted saves of earlier runs left in the checkpoint folder (only this package's
        temporary names; never the checkpoint this run resumes from), before the free-space check counts it."""
        removed, size = remove_leftovers(str(self.dirpath), keep=[trainer.ckpt_path])
        if removed:
            names = ", ".join(p.name for p in removed)
            rank_zero_info(f"bhyt_pl: removed {len(removed)} leftover(s) of interrupted saves from {self.dirpath} "
                           f"({human_size(size)}): {names}")  # fmt: skip

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
            size = checkpoint_bytes(pl_module)
            free = shutil.disk_usage(self.dirpath).free
            fix = "free space, or write elsewhere with --runs_dir or --checkpoint.dirpath"
            if saves_sharded(trainer.strategy):
                # the previous checkpoint stays until the new one is in place: two copies at once, one of which
                # may already be on disk
                present = _bytes_on_disk(Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
                need = 2 * size - min(present, size)
                if free < need:
                    problem = (
                        f"not enough free disk space for checkpoints in {str(self.dirpath)!r}: a sharded save keeps "
                        f"the previous checkpoint until the new one is complete, so two checkpoints of about "
                        f"{human_size(size)} (the weights and AdamW's two moments) need {human_size(need)} more, "
                        f"{human_size(free)} is free; {fix}"
                    )
            elif free < size:
                problem = (
                    f"not enough free disk space for checkpoints in {str(self.dirpath)!r}: one checkpoint needs "
                    f"about {human_size(size)} (the weights and AdamW's two moments), {human_size(free)} is free; "
                    f"{fix}"
                )
        problem = trainer.strategy.broadcast(problem)
        if problem:
            raise AgreedUsageError(problem)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_step = trainer.global_step
        self._ctrl_c = self._requeue = False
        self._step_end, self._stop_after_validation = None, None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            if self.save_on_ctrl_c:
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
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._step_end is not None:  # a validation Lightning announced did not run (an empty validation set)
            step = self._step_end[0]
            self._step_end = None
            rank_zero_warn(f"bhyt_pl: no validation ran after step {step}; the checkpoint due there was not written")

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        validates = validation_follows(trainer)
        if validates:  # the step's saves (ModelCheckpoint's own decision) once its validation has ended
            self._step_end = (trainer.global_step, outputs, batch, batch_idx)
        else:
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
        if validates:  # the validation due at this step first: a checkpoint saved before it would skip it
            self._stop_after_validation = ctrl_c
            return
        self._save_and_stop(trainer, ctrl_c)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._step_end is not None:
            _, outputs, batch, batch_idx = self._step_end
            self._step_end = None
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # the step's saves, now
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking:
            return
        sigterm = trainer.received_sigterm
        if trainer.world_size > 1:  # saving is collective: every rank decides alike
            sigterm = trainer.strategy.reduce_boolean_decision(sigterm, all=False)
        if sigterm:  # Lightning stops right after this validation: save its step here, not past its end
            self.save_last_now(trainer)
        if self._stop_after_validation is not None:
            ctrl_c, self._stop_after_validation = self._stop_after_validation, None
            self._save_and_stop(trainer, ctrl_c)

    def _save_and_stop(self, trainer: L.Trainer, ctrl_c: bool) -> None:
        """Save ``last`` at this step and end the run: ``StoppedByCtrlC``, or SLURM's requeue and ``Requeued``."""
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
            rank_zero_info(
                f"bhyt_pl: SLURM requeue signal at step {trainer.global_step}; saved {where}; {outcome}"
                + ("; the requeued job resumes from it" if requeued else "; resume with --ckpt_path last")
            )
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

    @override
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Lightning's save, atomic for sharded checkpoints too, and failing on every rank when it fails on one
        (module docstring). Loggers hear of the checkpoint once it is in place."""
        target, step = Path(filepath), trainer.global_step
        sharded = saves_sharded(trainer.strategy) and "://" not in filepath
        write_to = temporary_path(target, step) if sharded else target
        if sharded:
            if trainer.is_global_zero:  # a stale one from an interrupted run: the writer would write over it
                remove_checkpoint_path(write_to)
            trainer.strategy.barrier("RunCheckpoint.sharded_save")
        failures: list[BaseException] = []
        with _failures_recorded(trainer.strategy, failures):
            trainer.save_checkpoint(write_to, self.save_weights_only)  # every rank has written when it returns
        if failures:  # a full disk named as such, before a sharded save's partial folder goes (``save_disk_full``)
            size = checkpoint_bytes(trainer.lightning_module)
            failures = [save_disk_full(err, target, write_to, size) or err for err in failures]
        failed = _failed_ranks(trainer, failures)
        if sharded and not failed:
            if trainer.is_global_zero:
                try:
                    commit_sharded_checkpoint(write_to, target, step)
                except Exception as err:
                    failures.append(err)
            failed = _failed_ranks(trainer, failures)  # every rank waits until the checkpoint is in place
        if failed:
            if sharded and trainer.is_global_zero:
                shutil.rmtree(write_to, ignore_errors=True)
            rank, reason = failed[0]
            previous = (target, checkpoint_step(target)) if checkpoint_problem(target) is None else None
            previous = previous or newest_complete_beside(target)
            if previous is None:
                kept = "no earlier checkpoint is there"
            else:
                step_text = "" if previous[1] is None else f" (step {previous[1]})"
                kept = f"the previous checkpoint {previous[0]}{step_text} is intact"
            message = f"saving {target} at step {step} failed on rank {rank} ({reason}); {kept}"
            raise CheckpointSaveError(message, target, step, kept) from (failures[0] if failures else None)
        # ModelCheckpoint._save_checkpoint's bookkeeping, after the checkpoint is in place
        self._last_global_step_saved = step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

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

"""A study run stopped by its job's preemption or time limit, and resumed where it stopped.

``preemption_requested()`` is set inside a submitit job when its preemption or timeout signal, or SIGTERM,
arrives (``bhyt_pl.study.launch.submitit_job``). ``RunCheckpointOnPreemption`` reads it at the end of every
optimizer step (one flag
read); when it is set, the callback saves the whole run to ``<run folder>/last.ckpt`` and raises
``RunPreempted``. The checkpoint is Lightning's (``trainer.save_checkpoint``: model, optimizer, LR scheduler, loop
counters, the train dataloader's position, every callback's ``state_dict``) with, as this callback's own state,
the run's spec, the in-memory logger's metrics and what the run measured before training (``run_state``). The
requeued job calls the run again with the same spec; ``saved_run_state`` reads that state back, and the run
resumes with ``trainer.fit(..., ckpt_path=last.ckpt)``, which restores every callback, this one included.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from bhyt_pl.study.run.callbacks import MemoryLogger

__all__ = ["RunCheckpointOnPreemption", "RunPreempted", "preemption_requested", "saved_run_state"]

log = logging.getLogger(__name__)

_PREEMPTED = threading.Event()


def preemption_requested() -> bool:
    """Whether this job got submitit's preemption or timeout signal.

    A run checks it at the end of each step; when it is set, the run saves its state (``last.ckpt`` and its
    callbacks' state) and raises ``RunPreempted``. Always False outside a submitit job.
    """
    return _PREEMPTED.is_set()


class RunPreempted(BaseException):
    """Raised by a run that saved its state after ``preemption_requested()``: the job is requeued with the same spec.

    A ``BaseException``, like ``SystemExit``: code that records a run's failures (``except Exception``) lets it
    through to ``CheckpointableRun``.
    """


class RunCheckpointOnPreemption(L.Callback):
    """Saves the run to ``path`` and raises ``RunPreempted`` at the end of the first optimizer step after
    ``preemption_requested()``; carries the run's own state in the checkpoint (module docstring).

    Place it after the callbacks that record the step (they record it before the save). A step at which the fit
    stops anyway (a divergence) is not interrupted: the run ends there and records it.

    Args:
        path: the checkpoint, ``<run folder>/last.ckpt``; written to a temporary name beside it, then renamed.
        spec: the run's spec as plain data: stored, and compared by ``saved_run_state`` on resume.
        memory: the run's in-memory logger (its metrics are saved and restored with the run).
        run_state: what the run measured outside the fit, at the moment of the save (plain data).

    Example:
        >>> callback = RunCheckpointOnPreemption(Path("runs/a/last.ckpt"), {"label": "a"}, MemoryLogger(), dict)
    """

    def __init__(
        self, path: Path, spec: dict[str, object], memory: MemoryLogger, run_state: Callable[[], dict[str, object]]
    ) -> None:
        self.path, self.spec, self.memory, self.run_state = Path(path), spec, memory, run_state
        self.restored: dict[str, object] | None = None  # ``run_state`` of the try this fit resumed, once restored

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stop = preemption_requested()
        if trainer.world_size > 1:  # every rank stops after the same step
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop or trainer.should_stop or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        trainer.save_checkpoint(tmp)  # every rank has written when it returns
        if trainer.is_global_zero:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # whole or absent: a job killed during the save keeps the previous one
        trainer.strategy.barrier("RunCheckpointOnPreemption")
        log.warning("study run preempted at step %d: saved %s; the requeued job resumes from it",
                    trainer.global_step, self.path)  # fmt: skip
        raise RunPreempted(f"preempted at step {trainer.global_step}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "memory": self.memory.state_dict(), "run": self.run_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["spec"] != self.spec:  # saved_run_state keeps such a checkpoint from being used
            raise ValueError(f"{self.path} holds another spec's run: {state_dict['spec']} (this run: {self.spec})")
        self.memory.load_state_dict(state_dict["memory"])
        self.restored = state_dict["run"]


def saved_run_state(path: Path, spec: dict[str, object]) -> dict[str, object] | None:
    """The ``run_state`` a preempted try of this spec saved at ``path`` (and its ``step``), or None: no checkpoint
    there, or one that cannot be read or belongs to another spec (then it is deleted, with a log line, and the run
    starts over)."""
    if not path.is_file():
        return None
    started = time.perf_counter()
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)  # the run's own file
        state = checkpoint["callbacks"][RunCheckpointOnPreemption.__qualname__]
        saved_spec, run = state["spec"], state["run"]
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint is only a lost head start
        log.warning("study run: %s cannot be resumed (%s: %s); deleted, the run starts over",
                    path, type(exc).__name__, exc)  # fmt: skip
        path.unlink(missing_ok=True)
        return None
    if saved_spec != spec:
        changed = sorted(k for k in set(saved_spec) | set(spec) if saved_spec.get(k) != spec.get(k))
        log.warning("study run %s: %s was saved for another spec (%s differ); deleted, the run starts over",
                    spec.get("label"), path, ", ".join(changed))  # fmt: skip
        path.unlink(missing_ok=True)
        return None
    log.info("study run %s: resuming from %s at step %s (read in %.1f s)",
             spec.get("label"), path, checkpoint.get("global_step"), time.perf_counter() - started)  # fmt: skip
    return {**run, "step": checkpoint.get("global_step")}

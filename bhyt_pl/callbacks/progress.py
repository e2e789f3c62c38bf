"""``StepProgressBar``: training progress as optimizer steps out of the run's total.

Lightning's bar counts batches of the current epoch out of the loader's length (an infinite stream
shows ``150/150`` forever, a resume ``160/9``) and prints ``Epoch 0/-2`` without ``max_epochs``.
Pretraining is measured in steps, so this bar shows ``trainer.global_step`` out of
``trainer.estimated_stepping_batches`` (``max_steps`` when set), continuing from the resumed step.

The bar is set up when training starts as well as at each epoch start: a resume from a checkpoint saved
mid-epoch (a periodic save, SIGTERM, Ctrl-C, a SLURM requeue, a kill) skips ``on_train_epoch_start``, and
Lightning's bar would then read ``Training: 7/?``, without a total or a time left. ``v_num`` is the run
folder's version (``runs/<run_name>/version_N``) even beside other loggers, whose versions Lightning would
join and cut to their last four characters (``0_a1b24ecf`` -> ``4ecf`` with W&B).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from typing_extensions import override

__all__ = ["StepProgressBar", "run_version"]


class StepProgressBar(TQDMProgressBar):
    """A TQDM progress bar whose training bar reads ``global_step / total steps``.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[StepProgressBar()], max_steps=100)
    """

    @staticmethod
    def total_steps(trainer: L.Trainer) -> int | None:
        """Optimizer steps of the whole run, None when unknown (infinite data without ``max_steps``)."""
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return trainer.max_steps
        total = trainer.estimated_stepping_batches
        return int(total) if math.isfinite(total) else None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_bar(trainer)  # a mid-epoch resume calls no on_train_epoch_start

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        self._start_bar(trainer)

    def _start_bar(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.reset(total=self.total_steps(trainer))
        bar.n = bar.initial = trainer.global_step  # a resume starts here: the rate counts this run's steps only
        epoch_based = trainer.max_steps is None or trainer.max_steps < 0
        bar.set_description(f"Epoch {trainer.current_epoch} step" if epoch_based else "Step")
        bar.refresh()

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's progress-bar metrics, with ``v_num`` the run folder's version (``run_version``)."""
        items = super().get_metrics(trainer, pl_module)
        version = run_version(trainer)
        if version is not None:
            items["v_num"] = version
        return items

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is not None and self._should_update(step, bar.total) and not bar.disable:
            bar.n = step
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))


def run_version(trainer: L.Trainer) -> int | str | None:
    """The version of the run folder's log (the first TensorBoard logger: ``bhyt_pl.runs.RunLogger`` under the
    CLI), None without one."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.version
    return None

"""Keeps BHyT's cached constants ``c = ||W_V W_O||_F^2 / (T d)`` in step with the training weights, and carries
the values in use through checkpoints so that a resumed fit continues the uninterrupted one exactly."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from bhyt_pl.checkpoint import NORM_CONSTANTS, saved_norm_constants
from bhyt_pl.model import Llama
from bhyt_pl.parallelize import full_weights

__all__ = ["NormConstantRefresh", "default_refresh_interval", "norm_refresh_callbacks"]

log = logging.getLogger(__name__)


def default_refresh_interval(max_steps: int) -> int:
    """``N = max(1, min(1000, max_steps // 50))`` optimizer steps (docs/method.md, section 3)."""
    return max(1, min(1000, max_steps // 50))


class NormConstantRefresh(L.Callback):
    """Recomputes every block's weight-derived norm constants from the current weights every
    ``every_n_steps`` optimizer steps and at the start of a new fit, and makes a resumed fit continue with the
    constants the saved run was using.

    Between two scheduled refreshes the constants in use were computed from older weights, so recomputing them
    from a checkpoint's weights would give a resumed run values the uninterrupted run never had. Every checkpoint
    saved while this callback is in the trainer therefore stores them (``Llama.norm_constants``, in the entry
    ``bhyt_pl.checkpoint.NORM_CONSTANTS``, which ``saved_norm_constants`` reads), as they are at the end of the
    saved step: a save made at that
    step's end ahead of this callback's own hook (the study's preemption save) runs the refresh due at that step
    first. Restoring a checkpoint (``fit``/``validate``/``test``/``predict`` with ``ckpt_path``) puts them back
    (``Llama.set_norm_constants``) once the weights are loaded, under every strategy, on every rank; a checkpoint
    without them (older ones) gets constants recomputed from its weights, as before. Loading weights outside the
    Trainer: ``bhyt_pl.load_model`` puts the saved constants back too; ``Llama.load_state_dict`` alone, an
    exported Hugging Face model and ``init_checkpoint`` recompute them from the weights (the value the next
    refresh would give).

    ``LlamaLM`` adds it automatically when its norm scheme needs it (``bhyt``); put one in
    ``trainer.callbacks`` (``callbacks/norm_refresh.yaml``) to change the interval or, with
    ``enabled=False``, to switch the refresh off; the automatic one is then not added. Under FSDP2
    every rank gathers the full value/output weights (``DTensor.full_tensor``), so all ranks end with
    the same ``c``; every rank calls the refresh on the same steps and restores the same saved values.

    Args:
        every_n_steps: refresh interval in optimizer steps; None derives it from ``trainer.max_steps``
            (or the estimated total) as ``max(1, min(1000, max_steps // 50))``; 0 disables the
            periodic refresh (fit start and checkpoint loads still set the constants).
        enabled: False turns every refresh of this callback off (``c`` then only changes when weights
            are initialised or loaded, and a resume keeps the saved value); its presence still keeps
            ``LlamaLM`` from adding its own.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[NormConstantRefresh(every_n_steps=100)], max_steps=1)
    """

    def __init__(self, every_n_steps: int | None = None, enabled: bool = True) -> None:
        if every_n_steps is not None and not (isinstance(every_n_steps, int) and every_n_steps >= 0):
            raise ValueError(f"every_n_steps must be an int >= 0 or None, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.enabled = enabled
        self.interval = 0
        self.refreshes = 0
        self._last_step = -1
        self._restored = False
        """Whether this fit restored the constants from its checkpoint (then fit start does not recompute them)."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restored = False
        if not self.enabled:
            self.interval = 0
        elif self.every_n_steps is not None:
            self.interval = self.every_n_steps
        else:
            total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
            if total is None and stage == "fit":
                estimated = trainer.estimated_stepping_batches
                total = int(estimated) if estimated != float("inf") else 50_000
            self.interval = default_refresh_interval(total or 50_000)

    @staticmethod
    def _models(pl_module: L.LightningModule) -> dict[str, Llama]:
        return {name: module for name, module in pl_module.named_modules() if isinstance(module, Llama)}

    def refresh(self, pl_module: L.LightningModule) -> None:
        with full_weights(pl_module):  # FSDP1: whole matrices; FSDP2 gathers in refresh_constants
            for module in self._models(pl_module).values():
                module.refresh_norm_constants()
        self.refreshes += 1

    def _refresh_due(self, step: int) -> bool:
        return bool(self.interval) and step != self._last_step and step % self.interval == 0

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        if not self.enabled:
            rank_zero_info("NormConstantRefresh: disabled; norm constants change only when weights are loaded")
            return
        if not self._restored:  # a new fit: the weights are final here (initialised, or ``init_checkpoint``'s)
            # (strategies that restore ``ckpt_path`` after this hook, FSDP among them, set the constants then)
            self.refresh(pl_module)
        rank_zero_info(f"NormConstantRefresh: refreshing norm constants every {self.interval} optimizer steps")

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # the restored step under every strategy

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # counts optimizer steps: unchanged while gradients accumulate
        if self._refresh_due(step):
            self.refresh(pl_module)
        self._last_step = step

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"every_n_steps": self.every_n_steps, "enabled": self.enabled}

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.training and self._refresh_due(trainer.global_step):
            # saved at this step's end ahead of this callback's hook: the refresh due at this step first, so that
            # the checkpoint holds the constants the next step uses (the hook then finds it done)
            self.refresh(pl_module)
            self._last_step = trainer.global_step
        checkpoint[NORM_CONSTANTS] = {name: model.norm_constants() for name, model in self._models(pl_module).items()}

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Lightning calls this after the checkpoint's weights are in the model, under every strategy and on every
        # rank (FSDP restores after ``on_fit_start``, the others before it)
        saved, models = saved_norm_constants(checkpoint), self._models(pl_module)
        if saved is not None and saved.keys() == models.keys():
            for name, model in models.items():
                model.set_norm_constants(saved[name])
        else:
            if saved is not None:
                rank_zero_warn(
                    f"NormConstantRefresh: the checkpoint's norm constants are for models {sorted(saved)}, this "
                    f"module has {sorted(models)}; recomputing them from the loaded weights"
                )
            self.refresh(pl_module)  # an older checkpoint: from its weights, as a load always did
        self._restored = True


def norm_refresh_callbacks(trainer: L.Trainer | None, needs_refresh: bool) -> list[L.Callback]:
    """What ``LlamaLM.configure_callbacks`` returns: a default ``NormConstantRefresh`` when the scheme
    needs one and the trainer has none yet.

    Lightning *replaces* trainer callbacks of the same type by those a module returns from
    ``configure_callbacks`` (``_CallbackConnector._attach_model_callbacks``), so returning a default
    unconditionally would silently discard a user's configured or disabled refresh.
    """
    if not needs_refresh:
        return []
    if trainer is not None and any(isinstance(cb, NormConstantRefresh) for cb in trainer.callbacks):
        return []
    return [NormConstantRefresh()]

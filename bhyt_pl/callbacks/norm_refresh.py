"""Keeps BHyT's cached constants ``c = ||W_V W_O||_F^2 / (T d)`` in step with the training weights."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from bhyt_pl.model import Llama
from bhyt_pl.parallelize import full_weights

__all__ = ["NormConstantRefresh", "default_refresh_interval", "norm_refresh_callbacks"]

log = logging.getLogger(__name__)


def default_refresh_interval(max_steps: int) -> int:
    """``N = max(1, min(1000, max_steps // 50))`` optimizer steps (docs/method.md, section 3)."""
    return max(1, min(1000, max_steps // 50))


class NormConstantRefresh(L.Callback):
    """Recomputes every block's weight-derived norm constants from the current weights: at fit start
    (which Lightning runs after restoring a checkpoint given as ``ckpt_path``), and every
    ``every_n_steps`` optimizer steps. Loading weights outside fit (``validate``/``test`` with a
    checkpoint, ``load_state_dict``) is covered by ``Llama``'s own post-load hook.

    ``LlamaLM`` adds it automatically when its norm scheme needs it (``bhyt``); put one in
    ``trainer.callbacks`` (``callbacks/norm_refresh.yaml``) to change the interval or, with
    ``enabled=False``, to switch the refresh off; the automatic one is then not added. Under FSDP2
    every rank gathers the full value/output weights (``DTensor.full_tensor``), so all ranks end with
    the same ``c``; every rank calls the refresh on the same steps.

    Args:
        every_n_steps: refresh interval in optimizer steps; None derives it from ``trainer.max_steps``
            (or the estimated total) as ``max(1, min(1000, max_steps // 50))``; 0 disables the
            periodic refresh (fit start and checkpoint loads still refresh).
        enabled: False turns every refresh of this callback off (``c`` then only changes when weights
            are initialised or loaded); its presence still keeps ``LlamaLM`` from adding its own.

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

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
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

    def refresh(self, pl_module: L.LightningModule) -> None:
        with full_weights(pl_module):  # FSDP1: whole matrices; FSDP2 gathers in refresh_constants
            for module in pl_module.modules():
                if isinstance(module, Llama):
                    module.refresh_norm_constants()
        self.refreshes += 1

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        if not self.enabled:
            rank_zero_info("NormConstantRefresh: disabled; norm constants change only when weights are loaded")
            return
        self.refresh(pl_module)  # the weights are final here: initialised, or restored from ckpt_path
        rank_zero_info(f"NormConstantRefresh: refreshing norm constants every {self.interval} optimizer steps")

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # counts optimizer steps: unchanged while gradients accumulate
        if self.interval and step != self._last_step and step % self.interval == 0:
            self.refresh(pl_module)
        self._last_step = step

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"every_n_steps": self.every_n_steps, "enabled": self.enabled}


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

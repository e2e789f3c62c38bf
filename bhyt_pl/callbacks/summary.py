"""``RunModelSummary``: Lightning's model summary with the training FLOPs the throughput monitor uses.

Lightning's summary counts FLOPs by running ``example_input_array`` through the model, which
``LlamaLM`` does not set (a forward of a large model at start-up would cost time and memory), so it
printed ``0 Total Flops``. This one prints the analytic training FLOPs of one device's batch, the
``flops_per_batch`` behind ``train/flops_per_sec`` and MFU (``LlamaLM.expected_flops_per_batch``).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import ModelSummary as Summary
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from typing_extensions import override

__all__ = ["RunModelSummary", "training_flops_per_batch"]

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")
"""Lightning's own summary logger: the table goes where it always went."""


def training_flops_per_batch(trainer: L.Trainer, pl_module: L.LightningModule) -> float | None:
    """Training FLOPs (forward + backward) of one device's batch, from the module's
    ``expected_flops_per_batch(batch_size)`` (``LlamaLM``) and the data module's ``batch_size``; None when
    either does not say (or the module has no sequence length to count with)."""
    expected = getattr(pl_module, "expected_flops_per_batch", None)
    batch_size = getattr(trainer.datamodule, "batch_size", None)
    if not callable(expected) or not isinstance(batch_size, int):
        return None
    flops = expected(batch_size)
    return None if flops is None else float(flops)  # None: the module knows no sequence length


class _WithFlops(Summary):
    def __init__(self, model: L.LightningModule, max_depth: int, flops: float) -> None:
        super().__init__(model, max_depth=max_depth)
        self._training_flops = flops

    @property
    @override
    def total_flops(self) -> int:
        return int(self._training_flops)


class RunModelSummary(ModelSummary):
    """``ModelSummary`` whose FLOPs line is the training FLOPs of one device's batch (``LlamaLM``);
    other modules keep Lightning's count and label.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[RunModelSummary(max_depth=1)], max_steps=10)
    """

    _training_flops: bool = False

    @override
    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        flops = training_flops_per_batch(trainer, pl_module)
        self._training_flops = flops is not None
        if flops is None:
            return super()._summary(trainer, pl_module)
        return _WithFlops(pl_module, self._max_depth, flops)

    def summarize(  # an instance method: the parent calls it through ``self``
        self,
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if not self._training_flops:
            ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                   total_training_modes, total_flops, **summarize_kwargs)  # fmt: skip
            return
        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]  # per layer: 0 without input
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        label = "Training FLOPs per batch and device (as in train/flops_per_sec)"
        log.info("\n" + table.replace("Total Flops", label))

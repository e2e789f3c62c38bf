"""``ValidateAtLastStep``: every fit ends with a validation pass at its last optimizer step.

With ``val_check_interval`` in steps, Lightning validates only at multiples of it, so a run whose
``max_steps`` is not one (a 30-step try of a recipe that validates every 50) ends without any ``val/loss``,
and a longer one ends with a stale value. This callback asks Lightning for one more pass through its public
stopping flag: ``trainer.should_stop`` set after the final step makes the training loop validate before it
stops, as it does for ``EarlyStopping``; when the final step is already a validation point the pass runs once.
Nothing happens when validation is off (``limit_val_batches=0``, as the study and the bench set it). A signal
(SIGTERM, Ctrl-C, SLURM's requeue) that comes at the last step itself does not skip the pass: ``RunCheckpoint``
saves that step after it, so the saved run is complete with its final ``val/loss`` (a run saved at its last step
without it would never get it: resuming it has nothing to train). A signal before the last step ends the run
there, without this pass.
``LlamaLM`` adds it by itself (``configure_callbacks``).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from typing_extensions import override

__all__ = ["ValidateAtLastStep", "final_validation_callbacks"]


class ValidateAtLastStep(L.Callback):
    """Validate at the last optimizer step of a fit (``max_steps``, else the whole schedule's length).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[ValidateAtLastStep()], max_steps=30, val_check_interval=50)
    """

    @staticmethod
    def final_step(trainer: L.Trainer) -> int | None:
        """The fit's last optimizer step, None when unknown (infinite data without ``max_steps``)."""
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return trainer.max_steps
        total = trainer.estimated_stepping_batches
        return int(total) if math.isfinite(total) else None

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        final = self.final_step(trainer)
        if final is None or trainer.global_step < final or not trainer.enable_validation:
            return  # global_step counts optimizer steps: unchanged while gradients accumulate
        trainer.should_stop = True  # the training loop validates before it stops (``_should_check_val_fx``)


def final_validation_callbacks(trainer: L.Trainer | None) -> list[L.Callback]:
    """What ``LlamaLM.configure_callbacks`` adds: a ``ValidateAtLastStep`` unless the trainer has one.

    Lightning replaces trainer callbacks of a type the module returns, so a configured one is left alone.
    """
    if trainer is not None and any(isinstance(cb, ValidateAtLastStep) for cb in trainer.callbacks):
        return []
    return [ValidateAtLastStep()]

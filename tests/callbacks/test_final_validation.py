"""``ValidateAtLastStep``: a fit validates at its last step, once, unless validation is off or a signal stopped the
run before that step."""

from __future__ import annotations

import os
import signal

import lightning as L
import pytest
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl import LlamaLM
from bhyt_pl.callbacks.final_validation import ValidateAtLastStep


class _ValidationSteps(L.Callback):
    """The optimizer steps at which validation passes ran (the sanity check excluded)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_validation_end(self, trainer: L.Trainer, *args) -> None:
        if not trainer.sanity_checking:
            self.steps.append(trainer.global_step)


def _fit(max_steps: int, every: int, *callbacks: L.Callback, **trainer_args) -> list[int]:
    seen = _ValidationSteps()
    settings = {"val_check_interval": every, "check_val_every_n_epoch": None, "limit_val_batches": 1, **trainer_args}
    trainer = quiet_trainer(max_steps=max_steps, callbacks=[*callbacks, seen], **settings)
    trainer.fit(LlamaLM(overrides=TINY_OVERRIDES, lr=1e-2), TokenDataModule())
    return seen.steps


def test_a_run_shorter_than_the_validation_interval_validates_at_its_last_step() -> None:
    """A 5-step run of a recipe that validates every 8 steps never validated."""
    assert _fit(5, 8) == [5]
    assert _fit(10, 4) == [4, 8, 10]  # the interval's points, then the last step


def test_a_last_step_that_is_a_validation_point_validates_once() -> None:
    assert _fit(8, 4) == [4, 8]


def test_no_validation_when_it_is_off() -> None:
    assert _fit(5, 8, limit_val_batches=0) == []  # the study's and the bench's setting: no extra pass


def test_accumulation_validates_after_the_last_optimizer_step_only() -> None:
    assert _fit(3, 8, accumulate_grad_batches=2) == [3]


class _SigtermAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_run_stopped_by_sigterm_before_its_last_step_does_not_validate() -> None:
    seen = _ValidationSteps()
    trainer = quiet_trainer(max_steps=6, val_check_interval=8, check_val_every_n_epoch=None, limit_val_batches=1,
                            callbacks=[_SigtermAt(3), seen])  # fmt: skip
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException
        trainer.fit(LlamaLM(overrides=TINY_OVERRIDES, lr=1e-2), TokenDataModule())
    assert trainer.global_step == 3 and seen.steps == []


def test_a_sigterm_at_the_last_step_still_validates_it() -> None:
    """The pass was skipped; the run then ended complete at its last step without its final ``val/loss``, and
    resuming it had nothing to train, so that validation was never made."""
    seen = _ValidationSteps()
    trainer = quiet_trainer(max_steps=3, val_check_interval=8, check_val_every_n_epoch=None, limit_val_batches=1,
                            callbacks=[_SigtermAt(3), seen])  # fmt: skip
    with pytest.raises(SystemExit):
        trainer.fit(LlamaLM(overrides=TINY_OVERRIDES, lr=1e-2), TokenDataModule())
    assert trainer.global_step == 3 and seen.steps == [3]


def test_llama_lm_adds_it_once_and_keeps_a_configured_one() -> None:
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(LlamaLM(overrides=TINY_OVERRIDES), TokenDataModule())
    assert sum(isinstance(cb, ValidateAtLastStep) for cb in trainer.callbacks) == 1
    mine = ValidateAtLastStep()
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[mine])
    trainer.fit(LlamaLM(overrides=TINY_OVERRIDES), TokenDataModule())
    assert [cb for cb in trainer.callbacks if isinstance(cb, ValidateAtLastStep)] == [mine]


def test_final_step_reads_max_steps_or_the_schedule() -> None:
    assert ValidateAtLastStep.final_step(L.Trainer(max_steps=30, logger=False)) == 30

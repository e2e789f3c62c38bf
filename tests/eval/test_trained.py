"""The whole path carries signal: a briefly trained model beats chance on the embedded next-verse task."""

from __future__ import annotations

import math

import lm_eval
import pytest
from lm_eval.tasks import TaskManager

from bhyt_pl.eval import BHyTLM


@pytest.mark.slow
def test_trained_model_beats_chance_on_next_verse(trained_checkpoint, embedded_suite):
    n, chance = 80, 0.25  # four choices
    lm = BHyTLM.from_checkpoint(trained_checkpoint, batch_size=16)
    manager = TaskManager(include_path=str(embedded_suite), include_defaults=False)
    out = lm_eval.simple_evaluate(
        lm, tasks=["kjv_next_verse"], num_fewshot=0, limit=n, task_manager=manager, log_samples=False
    )
    acc = out["results"]["kjv_next_verse"]["acc,none"]
    bound = chance + 3 * math.sqrt(chance * (1 - chance) / n)  # binomial 3-sigma above chance: 0.40
    assert acc > bound, f"accuracy {acc:.3f} is within 3 sigma of chance ({bound:.3f})"

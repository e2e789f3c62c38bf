"""The embedded suite: items are what they claim to be, and lm-eval loads and runs every task from
local YAMLs (absolute data_files) with ``TaskManager(include_path=..., include_defaults=False)``."""

from __future__ import annotations

import lm_eval
import pytest
from lm_eval.tasks import TaskManager

from bhyt_pl.eval import BHyTLM
from bhyt_pl.eval.tasks import EMBEDDED_GROUP, EMBEDDED_TASKS, build_items

from .conftest import small_model


def test_items_are_deterministic_and_well_formed():
    items = build_items(max_items=50)
    assert items == build_items(max_items=50)
    for row in items["kjv_next_verse"]["test"]:
        texts, labels = row["choices"]["text"], row["choices"]["label"]
        answer = texts[labels.index(row["answerKey"])]
        assert len(set(texts)) == 4 and labels == ["A", "B", "C", "D"]
        assert all(sorted(t.split()) == sorted(answer.split()) for t in texts)  # shuffles of the true verse
    for row in items["kjv_next_verse_hard"]["test"]:
        assert len(set(row["choices"]["text"])) == 4
    labels = [row["label"] for row in items["kjv_word_order"]["test"]]
    assert set(labels) == {0, 1} and abs(sum(labels) / len(labels) - 0.5) < 0.2
    assert all(len(rows["test"]) == 50 for task, rows in items.items() if task != "kjv_perplexity")
    assert len(items["kjv_perplexity"]["test"]) == 25  # the held-out chapters
    answers = {
        r["choices"]["text"][r["choices"]["label"].index(r["answerKey"])] for r in items["kjv_next_verse"]["test"]
    }
    prompts = {r["question"] for r in items["kjv_next_verse"]["train"]}
    assert not answers & prompts or len(answers & prompts) < 3  # few-shot chapters are disjoint from test chapters


def test_suite_registers_offline_and_every_output_type_runs(embedded_suite):
    manager = TaskManager(include_path=str(embedded_suite), include_defaults=False)
    assert set(EMBEDDED_TASKS) | {EMBEDDED_GROUP} <= set(manager.all_tasks)
    lm = BHyTLM(small_model(max_seq_len=256), "embedded", batch_size=8)
    out = lm_eval.simple_evaluate(
        lm, tasks=[EMBEDDED_GROUP], num_fewshot=1, limit=3, task_manager=manager, log_samples=False
    )
    results = out["results"]
    assert 0 <= results["kjv_next_verse"]["acc,none"] <= 1
    assert 0 <= results["kjv_word_order"]["acc,none"] <= 1
    assert results["kjv_perplexity"]["word_perplexity,none"] > 1
    assert results["kjv_complete"]["exact_match,none"] == pytest.approx(0.0)  # a random model completes nothing
    assert out["n-shot"]["kjv_perplexity"] == 0  # rolling tasks keep 0 shots

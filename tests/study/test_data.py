"""The study's data (``bhyt_pl.study.run.data``): one data-module setting for every run, the fixed validation batches,
and the unigram loss against a count by hand."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from bhyt_pl.study.run.data import StudyData, fixed_batches, unigram_entropy, unigram_loss_recorder


def test_study_data_makes_a_module_per_seed_and_travels_to_a_worker_whole() -> None:
    data = StudyData("embedded", "allenai/c4", "embedded", seq_len=32, batch_size=2, shuffle_buffer=4)
    assert pickle.loads(pickle.dumps(data)) == data
    first, again, other = data(42), data(42), data(43)
    assert (first.seq_len, first.batch_size) == (32, 2)
    batches = fixed_batches(first, 3)
    assert len(batches) == 3 and batches[0]["input_ids"].shape == (2, 32)
    assert torch.equal(batches[0]["input_ids"], fixed_batches(again, 1)[0]["input_ids"])  # the same batches
    first.setup("fit"), other.setup("fit")
    a, b = next(iter(first.train_dataloader())), next(iter(other.train_dataloader()))
    assert not torch.equal(a["input_ids"], b["input_ids"])  # another data seed, another order


class _Source:
    """Training batches of known tokens; no validation split."""

    tokenizer = None

    def __init__(self, train: list[list[int]]) -> None:
        self.train = train

    def setup(self, stage: str) -> None:
        pass

    def val_dataloader(self) -> list:
        return []

    def train_dataloader(self):
        for row in self.train:
            ids = torch.tensor([row])
            yield {"input_ids": ids, "labels": ids}


def test_unigram_loss_by_hand() -> None:
    # 2 training batches: token 1 three times, token 2 once; vocabulary 4, add-one smoothing: total 4 + 4 = 8
    # p(1) = 4/8, p(2) = 2/8, p(3) = 1/8; validation tokens 1, 3, -100 (ignored)
    source = _Source([[1, 1], [1, 2], [3, 3]])
    val = [{"input_ids": torch.tensor([[0, 0, 0]]), "labels": torch.tensor([[1, 3, -100]])}]
    expected = -(math.log(4 / 8) + math.log(1 / 8)) / 2
    assert unigram_entropy(source, val, train_batches=2, vocab_size=4) == pytest.approx(expected)


def test_a_study_records_the_unigram_loss_of_its_fixed_batches_in_its_meta() -> None:
    # all 3 training rows (fewer than 32 batches): token 1 three times, 2 once, 3 twice; add-one: total 6 + 4 = 10
    source = _Source([[1, 1], [1, 2], [3, 3]])
    val = [{"input_ids": torch.tensor([[0, 0, 0]]), "labels": torch.tensor([[1, 3, -100]])}]
    meta: dict[str, object] = {}
    seeds: list[int] = []
    unigram_loss_recorder(meta, lambda seed: seeds.append(seed) or source, 43, vocab_size=4)(val)
    assert seeds == [43] and meta["unigram_loss"] == round(-(math.log(4 / 10) + math.log(3 / 10)) / 2, 4)


def test_fixed_batches_fall_back_to_training_batches_without_a_validation_split() -> None:
    batches = fixed_batches(_Source([[1, 2], [3, 4], [5, 6]]), 2)
    assert [b["labels"].tolist() for b in batches] == [[[1, 2]], [[3, 4]]]
    with pytest.raises(ValueError, match="yielded no batch"):
        fixed_batches(_Source([]), 2)

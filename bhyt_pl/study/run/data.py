"""The data of a study: one ``C4DataModule`` setting shared by every run (each run shuffles with its own data
seed), the fixed validation batches every run is measured on, and the unigram loss of those batches (the loss a
model reaches by learning token frequencies only)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from bhyt_pl.data import C4DataModule

__all__ = ["StudyData", "fixed_batches", "unigram_entropy", "unigram_loss_recorder"]

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class StudyData:
    """The data module every run of a study trains on; ``study_data(data_seed)`` is a fresh one shuffled with
    ``data_seed`` (runs with the same data seed see the same batches in the same order). Plain data, so a worker
    process receives it whole.

    Args:
        data_files: C4-format shards (``"embedded"``, a directory or a glob); None streams ``path`` from the Hub.
        path: the Hub dataset when ``data_files`` is None.
        tokenizer: ``"embedded"``, a ``tokenizer.json`` path or a Hub name.
        seq_len, batch_size: the training shapes.
        num_workers: DataLoader workers.
        shuffle_buffer: documents in the streaming shuffle buffer.
    """

    data_files: str | None
    path: str
    tokenizer: str
    seq_len: int
    batch_size: int
    num_workers: int = 0
    shuffle_buffer: int = 1000

    def __call__(self, data_seed: int) -> C4DataModule:
        from bhyt_pl.data import C4DataModule

        return C4DataModule(
            path=self.path,
            data_files=self.data_files,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            shuffle_buffer=self.shuffle_buffer,
            seed=data_seed,
        )

    def training_tokens_per_epoch(self) -> int | None:
        """The training tokens one pass over this data gives (``C4DataModule.training_tokens_per_epoch``: known for
        the embedded corpus, None otherwise); no data is read."""
        return self(0).training_tokens_per_epoch()


def fixed_batches(datamodule: C4DataModule, count: int) -> list[Batch]:
    """The first ``count`` validation batches (training batches when the source has no validation split):
    the same tensors for every run: depth statistics and the validation loss use all of them, layer importance
    the first."""
    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    if isinstance(loader, list):  # C4DataModule returns [] without a validation split
        log.warning("the data source has no validation split: validating on the first training batches")
        loader = datamodule.train_dataloader()
    batches = []
    for batch in loader:
        batches.append({"input_ids": batch["input_ids"].clone(), "labels": batch["labels"].clone()})
        if len(batches) == count:
            break
    if not batches:
        raise ValueError("the data source yielded no batch for validation and depth statistics")
    return batches


def unigram_entropy(datamodule: C4DataModule, val_batches: list[Batch], train_batches: int, vocab_size: int) -> float:
    """Cross-entropy (nats) of the validation tokens under the unigram distribution of ``train_batches``
    training batches (add-one smoothing): the loss a model reaches by learning token frequencies only."""
    datamodule.setup("fit")
    counts: dict[int, int] = {}
    for i, batch in enumerate(datamodule.train_dataloader()):
        labels = batch["labels"][batch["labels"] != -100]
        for token, n in zip(*torch.unique(labels, return_counts=True), strict=True):
            counts[int(token)] = counts.get(int(token), 0) + int(n)
        if i + 1 >= train_batches:
            break
    total = sum(counts.values()) + vocab_size
    nll, n = 0.0, 0
    for batch in val_batches:
        labels = batch["labels"][batch["labels"] != -100].tolist()
        nll += sum(-math.log((counts.get(t, 0) + 1) / total) for t in labels)
        n += len(labels)
    return nll / max(n, 1)


def unigram_loss_recorder(
    meta: dict[str, object], data: StudyData, data_seed: int, vocab_size: int
) -> Callable[[list[Batch]], None]:
    """A study's ``on_start``: the unigram loss of its fixed validation batches (``unigram_entropy`` over 32 training
    batches of ``data_seed``'s order), into ``meta["unigram_loss"]``, the scale its report sets losses beside."""

    def record(batches: list[Batch]) -> None:
        meta["unigram_loss"] = round(unigram_entropy(data(data_seed), batches, 32, vocab_size), 4)

    return record

"""The evaluation set of a data module (validation, test, predict) and each rank's equal share of it.

One definition for any number of ranks W (docs/method.md, section 6): the first K items of the split in its
order, unshuffled, where K is the stage's ``trainer.limit_*_batches`` x ``batch_size`` when that limit is an
int (it counts batches of the whole set as one process reads it, not per rank), else the whole split; K (or
the split's length) is rounded down to a multiple of W, and item i goes to rank i mod W.

Every rank thus gets the same number of items, hence of batches, known before the pass: no rank leaves the
loop while another still runs a forward (FSDP's forward all-gathers parameters: the rank left waiting
hangs), and a token mean synced across ranks is the one-process mean over the same K items.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeVar

from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset, get_worker_info

from bhyt_pl.errors import AgreedUsageError

__all__ = ["STAGE_LIMITS", "EvalSet", "SharedStream", "eval_set", "eval_stages"]

T = TypeVar("T")

STAGE_LIMITS = {"validation": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}
"""Evaluation stage (the data module's ``val``/``test``/``predict`` dataloader) -> the Trainer limit it obeys."""

_SETUP_STAGES = {"fit": ("validation",), "validate": ("validation",), "test": ("test",), "predict": ("predict",)}


def eval_stages(setup_stage: str | None) -> tuple[str, ...]:
    """The evaluation stages a ``setup(stage)`` call prepares (``None``: all of them)."""
    return tuple(STAGE_LIMITS) if setup_stage is None else _SETUP_STAGES.get(setup_stage, ())


@dataclass(frozen=True)
class EvalSet:
    """The first ``size`` items of a split (``None``: all; 0: no evaluation) shared by ``world_size`` ranks.

    Example:
        >>> list(EvalSet(rank=1, world_size=2, size=4).stream(range(10)))
        [1, 3]
    """

    rank: int = 0
    world_size: int = 1
    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and self.size % self.world_size:
            raise ValueError(f"EvalSet size {self.size} is not a multiple of world_size {self.world_size}")

    def stream(self, items: Iterable[T]) -> Iterator[T]:
        """This rank's items of a stream read in full by every rank: in groups of ``world_size``, the rank keeps
        its member; an incomplete final group is dropped, so every rank stops after the same count, known to
        none in advance (a streamed split has no length)."""
        group: list[T] = []
        for item in items if self.size is None else islice(items, self.size):
            group.append(item)
            if len(group) == self.world_size:
                yield group[self.rank]
                group = []

    def loader(self, dataset: Any, **kwargs: Any) -> DataLoader:
        """A ``DataLoader`` of this rank's items of a map-style ``dataset`` (``kwargs``: the loader's own).

        Its sampler is a ``DistributedSampler`` (unshuffled, ``drop_last``) over the first items: Lightning
        leaves such a loader alone, where it would add its own sampler that pads the last ranks by repeating
        items and applies the batch limit per rank."""
        n = len(dataset) if self.size is None else min(self.size, len(dataset))
        subset = Subset(dataset, range(n))
        sampler = DistributedSampler(subset, self.world_size, self.rank, shuffle=False, drop_last=True)
        return DataLoader(subset, sampler=sampler, **kwargs)

    def require(self, available: int, what: str, fix: str) -> None:
        """Fail in one line when ``available`` items (count at least up to ``world_size``) leave a rank with
        none: ``what`` names the split and its count (``C4 split 'validation' has 1 window of 257 tokens``),
        ``fix`` how to get more."""
        if self.size != 0 and available < self.world_size:
            raise AgreedUsageError(f"{what} for {self.world_size} ranks; every rank needs at least one: {fix}")


def eval_set(trainer: Trainer | None, stage: str, batch_size: int) -> EvalSet:
    """The evaluation set of ``stage`` (a key of ``STAGE_LIMITS``) for this rank of ``trainer``.

    Ranks are data-parallel positions (``trainer.distributed_sampler_kwargs``); without a trainer, or on one
    device, one rank.

    Raises:
        AgreedUsageError: an int limit times ``batch_size`` leaves a rank without an item.
    """
    if trainer is None:
        return EvalSet()
    position = trainer.distributed_sampler_kwargs or {"rank": 0, "num_replicas": 1}
    rank, world = position["rank"], position["num_replicas"]
    name = STAGE_LIMITS[stage]
    limit = getattr(trainer, name)
    if not limit:
        return EvalSet(rank, world, 0)
    if not isinstance(limit, int):  # a fraction: the whole split (Lightning applies the fraction per rank)
        return EvalSet(rank, world, None)
    size = limit * batch_size // world * world
    if size == 0:
        raise AgreedUsageError(
            f"trainer.{name}={limit} x batch_size={batch_size} gives {limit * batch_size} {stage} item(s) for "
            f"{world} ranks; every rank needs at least one: set --trainer.{name} to at least "
            f"{math.ceil(world / batch_size)}",
        )
    return EvalSet(rank, world, size)


class SharedStream(IterableDataset):
    """This rank's share (``EvalSet.stream``) of an iterable dataset that every rank reads from its start.

    Read in the main process or in one DataLoader worker: more workers would each yield the same share.
    """

    def __init__(self, items: Iterable[Any], share: EvalSet) -> None:
        self.items, self.share = items, share

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ValueError(f"SharedStream reads one stream: use at most 1 DataLoader worker, got {info.num_workers}")
        return self.share.stream(self.items)

"""The evaluation set across ranks (bhyt_pl/data/eval_set.py): the first K items, item i on rank i mod W, with
rank and world size given directly (no process)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, DistributedSampler

from bhyt_pl.data.eval_set import EvalSet, SharedStream, eval_set, eval_stages
from bhyt_pl.errors import AgreedUsageError, UsageError

ITEMS = list("abcdefghij")  # 10 items in split order


def shares(world: int, size: int | None, how: str) -> list[list[str]]:
    """Each rank's items, read as a stream (``stream``) or through the map-style loader (``loader``)."""
    if how == "stream":
        return [list(EvalSet(rank, world, size).stream(iter(ITEMS))) for rank in range(world)]
    loaders = [EvalSet(rank, world, size).loader(ITEMS, batch_size=2, collate_fn=list) for rank in range(world)]
    return [[item for batch in loader for item in batch] for loader in loaders]


@pytest.mark.parametrize("how", ["stream", "loader"])
def test_ranks_get_equal_disjoint_shares_of_the_first_k(how: str) -> None:
    # written out by hand from the one-process list a..j
    assert shares(1, 4, how) == [["a", "b", "c", "d"]]
    assert shares(2, 6, how) == [["a", "c", "e"], ["b", "d", "f"]]
    assert shares(3, 6, how) == [["a", "d"], ["b", "e"], ["c", "f"]]
    # the whole split: 10 items over 3 ranks drop the incomplete last group (j), over 4 ranks i and j
    assert shares(3, None, how) == [["a", "d", "g"], ["b", "e", "h"], ["c", "f", "i"]]
    assert shares(4, None, how) == [["a", "e"], ["b", "f"], ["c", "g"], ["d", "h"]]
    # a K beyond the split: the split, rounded down to the ranks
    assert shares(4, 12, how) == shares(4, None, how)


@pytest.mark.parametrize(("world", "size"), [(2, 6), (3, 9), (4, None), (5, 10)])
def test_the_shares_together_are_the_one_process_first_k(world: int, size: int | None) -> None:
    one_process = ITEMS[: size if size is not None else len(ITEMS) // world * world]
    for how in ("stream", "loader"):
        got = shares(world, size, how)
        assert len({len(share) for share in got}) == 1  # equal counts
        assert sorted(item for share in got for item in share) == one_process  # disjoint, complete
        assert [got[i % world][i // world] for i in range(len(one_process))] == one_process  # item i on rank i mod W


def test_a_stream_is_read_no_further_than_k() -> None:
    read = []

    def items():
        for item in ITEMS:
            read.append(item)
            yield item

    assert list(EvalSet(1, 2, 4).stream(items())) == ["b", "d"]
    assert read == ["a", "b", "c", "d"]


def test_the_loader_keeps_a_distributed_sampler_that_lightning_leaves_alone() -> None:
    """Lightning replaces a loader's sampler in a distributed run unless it already is a ``DistributedSampler``
    (``_DataConnector._requires_distributed_sampler``); its own would pad the last ranks with repeated items."""
    loader = EvalSet(1, 2, 4).loader(ITEMS, batch_size=3, collate_fn=list)
    assert isinstance(loader.sampler, DistributedSampler) and loader.sampler.drop_last and not loader.sampler.shuffle
    assert list(loader) == [["b", "d"]]


def test_size_must_be_a_multiple_of_the_ranks() -> None:
    with pytest.raises(ValueError, match="size 5 is not a multiple of world_size 2"):
        EvalSet(0, 2, 5)


def _trainer(world: int, rank: int = 0, **limits) -> SimpleNamespace:
    """What ``eval_set`` reads of a Trainer in a ``world``-rank run."""
    defaults = {"limit_val_batches": 1.0, "limit_test_batches": 1.0, "limit_predict_batches": 1.0}
    return SimpleNamespace(distributed_sampler_kwargs={"rank": rank, "num_replicas": world}, **(defaults | limits))


def test_the_limit_counts_batches_of_the_whole_set() -> None:
    assert eval_set(None, "validation", 8) == EvalSet(0, 1, None)
    one = Trainer(accelerator="cpu", devices=1, limit_val_batches=3, limit_test_batches=0.5, logger=False)
    assert eval_set(one, "validation", 8) == EvalSet(0, 1, 24)
    assert eval_set(one, "test", 8) == EvalSet(0, 1, None)  # a fraction: the whole split
    assert eval_set(one, "predict", 8) == EvalSet(0, 1, None)
    assert eval_set(_trainer(2, 1, limit_val_batches=3), "validation", 8) == EvalSet(1, 2, 24)
    assert eval_set(_trainer(5, 4, limit_test_batches=3), "test", 3) == EvalSet(4, 5, 5)  # 9 rounded down to 5
    assert eval_set(_trainer(2, limit_predict_batches=0), "predict", 8).size == 0  # no evaluation


def test_a_limit_too_small_for_the_ranks_is_one_line() -> None:
    with pytest.raises(UsageError) as err:
        eval_set(_trainer(4, limit_val_batches=1), "validation", 2)
    assert str(err.value) == (
        "trainer.limit_val_batches=1 x batch_size=2 gives 2 validation item(s) for 4 ranks; every rank needs at "
        "least one: set --trainer.limit_val_batches to at least 2"
    )
    assert isinstance(err.value, AgreedUsageError)


def test_require_names_the_split_and_the_ranks() -> None:
    EvalSet(0, 2, 4).require(2, "split 'x' has 2 items", "add items")
    EvalSet(0, 2, 0).require(0, "split 'x' has 0 items", "add items")  # no evaluation: nothing to require
    with pytest.raises(UsageError, match=r"^split 'x' has 1 item for 2 ranks; every rank needs at least one: add it$"):
        EvalSet(1, 2, None).require(1, "split 'x' has 1 item", "add it")


def test_eval_stages_of_each_setup_stage() -> None:
    assert eval_stages("fit") == eval_stages("validate") == ("validation",)
    assert (eval_stages("test"), eval_stages("predict")) == (("test",), ("predict",))
    assert eval_stages(None) == ("validation", "test", "predict")


@pytest.mark.slow  # two DataLoader worker processes
def test_a_shared_stream_refuses_several_workers() -> None:
    loader = DataLoader(SharedStream(range(8), EvalSet(0, 2, None)), batch_size=2, num_workers=2)
    with pytest.raises(ValueError, match="use at most 1 DataLoader worker, got 2"):
        list(loader)
    one_worker = DataLoader(SharedStream(range(8), EvalSet(1, 2, None)), batch_size=2, num_workers=1)
    assert [batch.tolist() for batch in one_worker] == [[1, 3], [5, 7]]

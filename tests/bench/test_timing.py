"""``bhyt_pl.bench.timing``: the interleaved order, sample counts, warm-up and the garbage-collector state."""

from __future__ import annotations

import gc

import pytest
import torch

from bhyt_pl.bench.timing import interleaved, median, paired_ratio, synchronizer
from bhyt_pl.machine import machine_info


def test_each_repetition_starts_one_candidate_later_after_the_warmup() -> None:
    calls: list[str] = []
    candidates = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    samples = interleaved(candidates, repeats=4, warmup=2)
    assert calls[:6] == list("abcabc")  # two untimed rounds in the given order
    assert calls[6:] == list("abcbcacababc")  # repetition r starts at candidate r mod 3
    assert {n: len(s) for n, s in samples.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for s in samples.values() for t in s)


def test_sync_brackets_every_timed_call_and_the_collector_is_restored() -> None:
    events: list[str] = []
    seen_gc: list[bool] = []

    def work() -> None:
        events.append("call")
        seen_gc.append(gc.isenabled())

    assert gc.isenabled()
    interleaved({"w": work}, repeats=3, warmup=1, sync=lambda: events.append("sync"))
    assert events == ["call", "sync"] + ["sync", "call", "sync"] * 3
    assert seen_gc == [True, False, False, False]  # off while timing only
    assert gc.isenabled()


def test_repeats_must_be_positive_and_medians_are_statistical_medians() -> None:
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved({"a": lambda: None}, repeats=0)
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_cpu_synchronizer_is_a_no_op_and_machine_info_names_the_run() -> None:
    assert synchronizer(torch.device("cpu"))() is None
    info = machine_info(torch.device("cpu"))
    assert info["device"] == "cpu" and info["torch"] == torch.__version__
    assert info["torch_threads"] == torch.get_num_threads() and "gpu" not in info


def test_interleaved_rotates_the_order() -> None:
    calls: list[str] = []
    fns = {n: (lambda n=n: calls.append(n)) for n in "abc"}
    samples = interleaved(fns, repeats=3, warmup=1)
    assert {n: len(s) for n, s in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # after one warm-up round
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved(fns, repeats=0)


def test_paired_ratio_is_the_median_of_per_repetition_ratios_with_order_statistic_bounds() -> None:
    num = [2.0, 3.0, 5.0, 4.0, 6.0, 1.0, 9.0, 8.0, 7.0, 10.0, 11.0]  # ratios to 1.0: 1 .. 11
    r = paired_ratio(num, [1.0] * 11)
    # n = 11: P(Bin(11, 1/2) <= 1) = 12/2048, so [r_(2), r_(10)] covers 1 - 24/2048; [r_(3), r_(9)] only 0.935
    assert (r["median"], r["low"], r["high"], r["n"]) == (6.0, 2.0, 10.0, 11)
    assert r["coverage"] == pytest.approx(1 - 24 / 2048)
    assert paired_ratio([1.0, 2.0], [2.0, 2.0])["median"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="paired samples"):
        paired_ratio([1.0], [1.0, 2.0])

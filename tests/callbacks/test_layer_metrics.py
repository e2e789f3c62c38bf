"""The per-layer key format and the exact accumulation and reduction of ``LayerMetrics``, against hand sums."""

from __future__ import annotations

import pytest
import torch

from bhyt_pl.callbacks.layer_metrics import (
    LayerMetrics,
    layer_index,
    layer_key,
    layer_series,
    layer_width,
    split_layer_key,
)


def test_key_format_round_trips_and_sorts_in_depth_order() -> None:
    assert [layer_width(n) for n in (1, 10, 11, 100, 101)] == [2, 2, 2, 2, 3]
    assert layer_key(3) == "layer_03" and layer_key(7, layer_width(120)) == "layer_007"
    keys = [f"grad_norm/attn_in/{layer_key(i, layer_width(12))}" for i in range(12)]
    assert sorted(keys) == keys
    assert split_layer_key("saturation/mlp_in/layer_011") == ("saturation/mlp_in", 11)
    assert layer_index("magnitude/layer_04") == 4
    for other in ("grad_norm/embed", "grad_norm_total", "layer_03", "x/layer_", "x/layer_a1", "x/layers_01"):
        assert split_layer_key(other) is None and layer_index(other) is None


def test_layer_series_takes_one_statistic_in_layer_order() -> None:
    stats = {
        "magnitude/layer_01": 2.0,
        "magnitude/layer_00": 1.0,
        "median_magnitude/layer_00": 9.0,  # another statistic whose name ends the same
        "magnitude/attn_in/layer_00": 8.0,  # a site's
        "magnitude/layer_10": 3.0,
    }
    assert layer_series(stats, "magnitude") == [1.0, 2.0, 3.0]
    assert layer_series(stats, "magnitude/attn_in") == [8.0]
    assert layer_series(stats, "variance") == []


def test_means_and_maxima_accumulate_exactly() -> None:
    m = LayerMetrics()
    assert m.empty and m.compute() == {}
    m.add("a/layer_00", torch.tensor(3.0), 2)
    m.add("a/layer_00", torch.tensor(6.0, dtype=torch.float16), torch.tensor(4.0))
    m.add("b/layer_00", torch.tensor(1.0), 0)  # no items: no mean, so no value
    m.max("c/layer_00", torch.tensor(-2.0))
    m.max("c/layer_00", torch.tensor(5.0))
    assert not m.empty
    assert m.keys() == ["a/layer_00", "b/layer_00", "c/layer_00"]
    assert m.pack().tolist() == [9.0, 1.0, 6.0, 0.0, 5.0]  # sums, counts, maxima
    result = m.compute()
    assert result == {"a/layer_00": 1.5, "c/layer_00": 5.0}
    m.reset()
    assert m.empty


def test_cross_rank_reduction_sums_sums_and_counts_and_takes_the_largest_maximum() -> None:
    ranks = [LayerMetrics(), LayerMetrics()]
    ranks[0].add("a/layer_00", torch.tensor(3.0), 1)  # one token of value 3
    ranks[1].add("a/layer_00", torch.tensor(12.0), 3)  # three tokens of mean 4
    ranks[0].max("m/layer_00", torch.tensor(7.0))
    ranks[1].max("m/layer_00", torch.tensor(2.0))
    packed = [r.pack() for r in ranks]
    gathered = torch.stack(packed)  # what all_gather returns: [world, K]
    for r in ranks:
        got = r.compute(lambda t: gathered)
        assert got == {"a/layer_00": pytest.approx(15.0 / 4), "m/layer_00": 7.0}  # not the mean of means (3.5)
    # a summing reduce of the packed values (StabilityMonitor's path) gives the same means
    assert ranks[0].unpack((packed[0] + packed[1]).tolist())["a/layer_00"] == pytest.approx(15.0 / 4)


def test_a_quantile_over_ranks_is_the_quantile_of_every_ranks_values() -> None:
    """Ranks with different token counts: the counts travel first, then the values padded to the largest."""
    values = [torch.tensor([5.0, 1.0, 9.0]), torch.tensor([4.0, 2.0, 8.0, 6.0, 3.0])]
    ranks = [LayerMetrics(), LayerMetrics()]
    for r, v in zip(ranks, values, strict=True):
        r.sample("med/layer_00", v[:2], q=0.5)  # two passes: the values of both count
        r.sample("med/layer_00", v[2:], q=0.5)
        r.add("a/layer_00", v.sum(), v.numel())
    joined = torch.cat(values).sort().values  # 1..9 without 7: 8 values, the lower middle is 4
    assert ranks[0].keys() == ["a/layer_00", "med/layer_00"]

    def gather_for(rank: int):
        calls = iter(range(3))  # the packed means, then the counts, then the padded values of each rank

        def all_gather(t: torch.Tensor) -> torch.Tensor:
            step = next(calls)
            if step == 0:
                return torch.stack([r.pack() for r in ranks])
            if step == 1:
                return torch.tensor([[3], [5]])
            padded = [torch.cat([v, torch.zeros(5 - v.numel())]) for v in values]
            return torch.stack(padded)

        return all_gather

    for rank in (0, 1):
        got = ranks[rank].compute(gather_for(rank))
        assert got["med/layer_00"] == float(joined[(len(joined) - 1) // 2]) == float(torch.cat(values).median()) == 4.0
        assert got["a/layer_00"] == pytest.approx(float(torch.cat(values).mean()))
    single = LayerMetrics()
    single.sample("q/layer_00", torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), q=0.9)  # rank floor(0.9 * 4) = 3: 4.0
    assert single.compute() == {"q/layer_00": 4.0}
    with pytest.raises(ValueError, match="quantile 0.25 asked after 0.9"):
        single.sample("q/layer_00", torch.tensor([1.0]), q=0.25)

"""Per-layer metrics: the ``layer_<ii>`` key format, their accumulation over forward passes and their exact
reduction over ranks, shared by ``DepthStatsMonitor``, ``StabilityMonitor`` and the depth study.

A per-layer statistic is named ``<stat>[/<site>]/layer_<ii>``, ``<ii>`` the 0-based block index zero-padded
to ``layer_width(n_layers)`` digits (at least 2, so keys sort in depth order). Means are kept as a sum and
a count per key, so a mean over several passes and ranks is exact: sum the sums, sum the counts, divide.
A quantile needs the values themselves: they are kept, and gathered from every rank before it is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["LayerMetrics", "layer_index", "layer_key", "layer_series", "layer_width", "split_layer_key"]

LAYER_PREFIX = "layer_"


def layer_width(n_layers: int) -> int:
    """Digits of the layer index in keys of a model with ``n_layers`` blocks (at least 2)."""
    return max(2, len(str(n_layers - 1)))


def layer_key(index: int, width: int = 2) -> str:
    """``layer_<ii>`` for block ``index``: ``layer_key(3) == "layer_03"``."""
    return f"{LAYER_PREFIX}{index:0{width}d}"


def split_layer_key(key: str) -> tuple[str, int] | None:
    """``("<stat>[/<site>]", index)`` of a per-layer key (``"saturation/mlp_in/layer_03"`` ->
    ``("saturation/mlp_in", 3)``), None for a key that does not end in ``/layer_<ii>``."""
    head, _, last = key.rpartition("/")
    digits = last.removeprefix(LAYER_PREFIX)
    if not head or last == digits or not digits.isdigit():
        return None
    return head, int(digits)


def layer_index(key: str) -> int | None:
    """The block index of a per-layer key, None for other keys."""
    split = split_layer_key(key)
    return None if split is None else split[1]


def layer_series(stats: dict[str, float], stat: str) -> list[float]:
    """``[value of layer 0, layer 1, ...]`` of one statistic (``"magnitude"``, ``"saturation/mlp_in"``) from
    per-layer keys; keys of other statistics (including ``<stat>/<site>/layer_<ii>``) are ignored."""
    points = {}
    for key, value in stats.items():
        split = split_layer_key(key)
        if split is not None and split[0] == stat:
            points[split[1]] = value
    return [points[i] for i in sorted(points)]


class LayerMetrics:
    """Sums and counts per key (means), and maxima per key, accumulated in float64 over forward passes.

    ``pack`` lays every value out in one tensor ``[sums, counts, maxima]`` for one collective; ``unpack``
    turns a reduced tensor's values back into ``{key: mean or maximum}``. ``compute`` does both around an
    ``all_gather`` (sums of sums and counts, maxima of maxima), and takes each quantile over every rank's values.

    Example:
        >>> m = LayerMetrics()
        >>> m.add("magnitude/layer_00", torch.tensor(3.0), 2)
        >>> m.add("magnitude/layer_00", torch.tensor(5.0), 2)
        >>> m.max("max_abs/layer_00", torch.tensor(7.0))
        >>> m.sample("median/layer_00", torch.tensor([4.0, 1.0, 3.0, 2.0]), q=0.5)
        >>> m.compute()
        {'magnitude/layer_00': 2.0, 'max_abs/layer_00': 7.0, 'median/layer_00': 2.0}
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, torch.Tensor] = {}
        self._maxes: dict[str, torch.Tensor] = {}
        self._samples: dict[str, list[torch.Tensor]] = {}
        self._quantiles: dict[str, float] = {}

    @property
    def empty(self) -> bool:
        return not self._counts and not self._maxes and not self._samples

    def keys(self) -> list[str]:
        """Every key, means then maxima then quantiles, each sorted (the order of ``compute``)."""
        return sorted(self._sums) + sorted(self._maxes) + sorted(self._samples)

    def reset(self) -> None:
        self._sums.clear()
        self._counts.clear()
        self._maxes.clear()
        self._samples.clear()
        self._quantiles.clear()

    def add(self, key: str, total: torch.Tensor, count: float | torch.Tensor) -> None:
        """Add ``total`` (a sum over ``count`` items) to the mean of ``key``."""
        total = total.detach().to(torch.float64)
        count = torch.as_tensor(count, dtype=torch.float64, device=total.device)
        if key in self._sums:
            self._sums[key] = self._sums[key].to(total.device) + total
            self._counts[key] = self._counts[key].to(total.device) + count
        else:
            self._sums[key], self._counts[key] = total, count

    def max(self, key: str, value: torch.Tensor) -> None:
        """Keep the maximum of ``value`` and the values seen before under ``key``."""
        value = value.detach().to(torch.float64)
        self._maxes[key] = torch.maximum(self._maxes[key].to(value.device), value) if key in self._maxes else value

    def sample(self, key: str, values: torch.Tensor, q: float) -> None:
        """Keep ``values`` for the ``q``-quantile of ``key``: the value of rank ``floor(q * (n - 1))`` among the
        ``n`` sorted values of every call (and rank), an element of them (``q = 0.5``: ``torch.median``'s)."""
        if key in self._quantiles and self._quantiles[key] != q:
            raise ValueError(f"{key}: quantile {q} asked after {self._quantiles[key]}")
        self._quantiles[key] = q
        self._samples.setdefault(key, []).append(values.detach().flatten())

    def pack(self, device: torch.device | None = None) -> torch.Tensor:
        """``[sums (M), counts (M), maxima (X)]`` in key order, float64, on ``device`` (default: that of the
        first sum, else the CPU)."""
        mean_keys, max_keys = sorted(self._sums), sorted(self._maxes)
        if device is None:
            device = next(iter(self._sums.values())).device if mean_keys else torch.device("cpu")
        empty = torch.zeros(0, dtype=torch.float64, device=device)
        sums = torch.stack([self._sums[k].to(device) for k in mean_keys]) if mean_keys else empty
        counts = torch.stack([self._counts[k].to(device) for k in mean_keys]) if mean_keys else empty
        maxes = torch.stack([self._maxes[k].to(device) for k in max_keys]) if max_keys else empty
        return torch.cat([sums, counts, maxes])  # one collective for everything

    def unpack(self, values: list[float]) -> dict[str, float]:
        """``{key: sum / count}`` and ``{key: maximum}`` from the values of a (reduced) ``pack``; a mean over no
        items (count 0 on every rank) has no value and its key is left out."""
        mean_keys, max_keys = sorted(self._sums), sorted(self._maxes)
        m = len(mean_keys)
        result = {k: values[i] / values[m + i] for i, k in enumerate(mean_keys) if values[m + i] > 0}
        result.update({k: values[2 * m + i] for i, k in enumerate(max_keys)})
        return result

    def compute(self, all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Means and maxima per key, reduced over ranks when ``all_gather`` is given.

        Args:
            all_gather: maps a local tensor [K] to the stacked tensors of every rank [world, K]
                (``trainer.strategy.all_gather``); every rank must call ``compute`` together.
        """
        packed = self.pack()
        if all_gather is not None:
            gathered = all_gather(packed)  # [world, 2M + X]
            if gathered.ndim == 2:
                m = 2 * len(self._sums)
                packed = torch.cat([gathered[:, :m].sum(dim=0), gathered[:, m:].amax(dim=0)])
        result = self.unpack(packed.cpu().tolist())
        for key in sorted(self._samples):  # the same keys in the same order on every rank
            values = torch.cat(self._samples[key])
            if all_gather is not None:
                values = _gather_values(values, all_gather)
            if values.numel():
                rank = math.floor(self._quantiles[key] * (values.numel() - 1))
                result[key] = float(values.kthvalue(rank + 1).values)
        return result


def _gather_values(values: torch.Tensor, all_gather: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Every rank's ``values`` (their counts may differ): the counts first, then the values padded to the largest."""
    counts = all_gather(torch.tensor([values.numel()], device=values.device))
    if counts.ndim < 2:  # a single process
        return values
    counts = counts.flatten().tolist()
    padded = torch.zeros(max(counts), dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = all_gather(padded)  # [world, max count]
    return torch.cat([gathered[i, :n] for i, n in enumerate(counts)])

"""Per-layer statistics, each declared once: what it measures and in what unit, where and how it is measured, how
its values over tokens are reduced, and how the depth study summarises, compares and shows it.

A declaration (``LayerStatistic``) is all a new statistic needs: ``DepthStatsCollector`` measures it (and
``DepthStatsMonitor`` logs it as ``depth/<name>/layer_<ii>`` when ``monitor`` is set), the depth study records its
profile along training (``trajectory``), turns each of its ``summaries`` into a per-run metric
(``bhyt_pl.study.protocol.metrics``) that claims can compare within ``margin`` and that the report shows as a column
and a
panel, and ``python -m bhyt_pl compare`` draws the monitored ones against depth.

Where a statistic is measured (``measure``):

- ``OnBlockOutput(fn)``: ``fn(x, y)`` with ``x`` the block's input and ``y`` its output, both float32
  ``[B, T, d]``, returns one value per token ``[B, T]``;
- ``OnSiteInput(fn)``: ``fn(x)`` with ``x`` the input of a bhyt_pl norm site ``[..., d]``, one value per token;
- ``ByScheme()``: the norm scheme's sites report it (``BlockNorms.site_statistics``: saturation, lambdas, BHyT's
  moment ratios); the declaration says only how the study summarises it;
- ``FromProfile(source, fn)``: computed from another statistic's per-layer profile and the model width.

How the per-token values are reduced over the tokens of every batch (``reduction``): ``MEAN`` (exact across
passes and ranks: sums and counts), ``MAX``, or ``Quantile(q)`` (an element of the values: the lower one where
``q`` falls between two, so ``Quantile(0.5)`` is ``torch.median``'s median).

Summaries (``Summary.kind``), each a per-run scalar read from a profile (one value per layer, layer ``L`` last):

- ``last``: the last layer's value; compared between runs as an ln ratio (values span orders of magnitude);
- ``growth``: ``ln(value_L / value_q)``, ``q = max(1, L // 4)`` (1-based): already an ln ratio;
- ``growth_slope``: least-squares slope of ``ln value`` against the layer index over layers ``q .. L``;
- ``slope``: the same slope over layers ``2 .. L`` (the first block writes the residual stream's outliers);
- ``layer_mean``: the mean over layers of the finite values.

Both growth summaries skip the first blocks and are 0 for a profile that stays flat after them (docs/method.md,
section 10). The metric of a summary is named ``<name>`` (``last``, ``layer_mean``), ``<name>_growth``,
``<name>_growth_slope`` or ``<name>_slope``.

The statistics declared at the end of this module are registered on import, in the order of the study's columns and
panels. ``register_statistic`` called elsewhere (a notebook, a test) reaches this process only: the study's runs in
this process (``--workers 1``) measure it, its spawned workers (``--workers N``) import this module afresh and do
not, so a statistic they must measure is declared here.

Example:
    >>> import torch
    >>> rms = LayerStatistic(
    ...     "token_rms", "sqrt(mean_d y^2), mean over tokens", "root mean square of a token",
    ...     OnBlockOutput(lambda x, y: y.pow(2).mean(-1).sqrt()),
    ...     summaries=(Summary("last", header="last-layer token RMS", margin=0.2),),
    ... )
    >>> register_statistic(rms).name
    'token_rms'
    >>> unregister_statistic("token_rms")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from bhyt_pl.callbacks.layer_metrics import split_layer_key

__all__ = [
    "KINDS",
    "MAX",
    "MEAN",
    "ByScheme",
    "FromProfile",
    "LayerStatistic",
    "Max",
    "Mean",
    "OnBlockOutput",
    "OnSiteInput",
    "Quantile",
    "Summary",
    "growth",
    "growth_slope",
    "layer_profile",
    "log_slope",
    "quarter_layer",
    "register_statistic",
    "statistic",
    "statistics",
    "unregister_statistic",
]


# ----------------------------------------------------------------------------- where a statistic is measured
@dataclass(frozen=True)
class OnBlockOutput:
    """Measured on every block: ``fn(x, y) -> [B, T]`` from the block's input ``x`` and output ``y``
    (``[B, T, d]``, float32)."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class OnSiteInput:
    """Measured on every bhyt_pl norm site that is not an identity: ``fn(x) -> [...]`` from its input
    ``[..., d]``, logged as ``<name>/<site>/layer_<ii>``."""

    fn: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ByScheme:
    """Reported by the norm scheme's own sites (``BlockNorms.site_statistics``), as ``<name>/<site>/layer_<ii>``."""


@dataclass(frozen=True)
class FromProfile:
    """Computed from the profile of statistic ``source`` and the model width: ``fn(profile, dim) -> profile``."""

    source: str
    fn: Callable[[Sequence[float], int], list[float]]


Measure = OnBlockOutput | OnSiteInput | ByScheme | FromProfile


# ----------------------------------------------------------------------------- reductions over tokens
@dataclass(frozen=True)
class Mean:
    """The mean over tokens (sums and counts: exact over passes and ranks)."""


@dataclass(frozen=True)
class Max:
    """The maximum over tokens."""


@dataclass(frozen=True)
class Quantile:
    """The ``q``-quantile over tokens: the value of rank ``floor(q * (n - 1))`` (0-based) among the ``n`` sorted
    values, an element of them (``Quantile(0.5)``: the lower median, as ``torch.median``)."""

    q: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.q <= 1.0:
            raise ValueError(f"Quantile q must be in [0, 1], got {self.q}")


MEAN, MAX = Mean(), Max()
Reduction = Mean | Max | Quantile


# ----------------------------------------------------------------------------- summaries of a profile
def quarter_layer(n_layers: int) -> int:
    """The 1-based layer growth is measured from: ``L // 4`` (at least 1)."""
    return max(1, n_layers // 4)


def log_slope(values: Sequence[float], first_layer: int = 2) -> float:
    """Least-squares slope of ``ln(value)`` against the 1-based layer index, from ``first_layer`` to the last
    (the growth rate of a statistic with depth once the first blocks have written their outliers)."""
    points = [(i + 1, math.log(v)) for i, v in enumerate(values) if i + 1 >= first_layer and v > 0 and math.isfinite(v)]
    if len(points) < 2:
        return math.nan
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def growth(values: Sequence[float]) -> float:
    """``ln(values[L-1] / values[q-1])`` with ``q = quarter_layer(L)``: NaN unless both are finite and > 0."""
    if not values:
        return math.nan
    first, last = values[quarter_layer(len(values)) - 1], values[-1]
    if not (first > 0 and last > 0 and math.isfinite(first) and math.isfinite(last)):
        return math.nan
    return math.log(last / first)


def growth_slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``ln value`` against the layer index over layers ``q .. L`` (per layer)."""
    return log_slope(values, first_layer=quarter_layer(len(values))) if values else math.nan


def _last(values: Sequence[float]) -> float:
    return values[-1] if values else math.nan


def _finite_mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


KINDS: dict[str, tuple[str, Callable[[Sequence[float]], float]]] = {
    "last": ("", _last),
    "growth": ("_growth", growth),
    "growth_slope": ("_growth_slope", growth_slope),
    "slope": ("_slope", log_slope),
    "layer_mean": ("", _finite_mean),
}
"""``kind -> (metric-name suffix, fn(profile) -> value)``, in the order figures lay their panels out."""

SummaryKind = Literal["last", "growth", "growth_slope", "slope", "layer_mean"]


@dataclass(frozen=True)
class Summary:
    """One per-run scalar of a statistic, read from its profile.

    Args:
        kind: ``last``, ``growth``, ``growth_slope``, ``slope`` or ``layer_mean`` (module docstring).
        header: its column in the study's per-scheme tables; ``""``: no column.
        margin: equivalence / non-inferiority margin of a claim on it, on its comparison scale (ln units for
            ``last``); None: no such claim. The study's matched-rate table shows the summaries that have one.
        title: its panel in the study's trajectory figure; ``""``: no panel.
    """

    kind: SummaryKind
    header: str = ""
    margin: float | None = None
    title: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Summary kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.margin is not None and not self.margin > 0:
            raise ValueError(f"Summary margin must be > 0 or None, got {self.margin}")

    @property
    def log(self) -> bool:
        """Compared between runs as ``ln(a) - ln(b)`` (a last-layer value; growths are ln ratios already)."""
        return self.kind == "last"

    def metric(self, statistic: str) -> str:
        """The metric name of this summary of ``statistic``."""
        return statistic + KINDS[self.kind][0]

    def value(self, profile: Sequence[float]) -> float:
        return KINDS[self.kind][1](profile)


# ----------------------------------------------------------------------------- a statistic
@dataclass(frozen=True)
class LayerStatistic:
    """One per-layer statistic (module docstring).

    Args:
        name: its key, ``<name>[/<site>]/layer_<ii>``; letters, digits and ``_``.
        unit: what a value is, for axis labels (e.g. ``"mean over tokens of ||y_t||_2"``).
        description: what it measures, in words.
        measure: where and how it is measured (``OnBlockOutput``, ``OnSiteInput``, ``ByScheme``, ``FromProfile``).
        reduction: over tokens: ``MEAN``, ``MAX`` or ``Quantile(q)``.
        skip_tokens: leading positions left out of every sequence (the first token often carries a massive
            activation).
        monitor: ``DepthStatsMonitor`` logs it unless told which statistics to log.
        trajectory: the depth study records its profile at every trajectory point and draws it against depth.
        summaries: its per-run scalars, in the order of their columns.
    """

    name: str
    unit: str
    description: str
    measure: Measure
    reduction: Reduction = MEAN
    skip_tokens: int = 0
    monitor: bool = False
    trajectory: bool = False
    summaries: tuple[Summary, ...] = ()

    def __post_init__(self) -> None:
        problems = []
        if not self.name.replace("_", "").isalnum():
            problems.append(f"name must be letters, digits and '_', got {self.name!r}")
        if not isinstance(self.measure, (OnBlockOutput, OnSiteInput, ByScheme, FromProfile)):
            kinds = "OnBlockOutput, OnSiteInput, ByScheme or FromProfile"
            problems.append(f"measure must be {kinds}, got {self.measure!r}")
        if not isinstance(self.reduction, (Mean, Max, Quantile)):
            problems.append(f"reduction must be MEAN, MAX or Quantile(q), got {self.reduction!r}")
        if self.skip_tokens < 0:
            problems.append(f"skip_tokens must be >= 0, got {self.skip_tokens}")
        metrics = [s.metric(self.name) for s in self.summaries]
        if len(set(metrics)) != len(metrics):
            problems.append(f"two summaries share a metric name: {metrics}")
        if isinstance(self.measure, FromProfile) and (self.monitor or self.trajectory):
            problems.append("a statistic computed from another's profile is neither monitored nor recorded itself")
        if problems:
            raise ValueError(f"statistic {self.name!r}: " + "; ".join(problems))

    @property
    def collected(self) -> bool:
        """Measured by ``DepthStatsCollector``'s hooks (on a block output or a site input)."""
        return isinstance(self.measure, (OnBlockOutput, OnSiteInput))

    def profile(self, snapshot: Mapping[str, Sequence[float]], dim: int) -> list[float]:
        """Its per-layer values in a snapshot (``{statistic: profile}``, a study's trajectory point); a
        ``FromProfile`` statistic is computed from its source's."""
        if isinstance(self.measure, FromProfile):
            return list(self.measure.fn(snapshot.get(self.measure.source) or [], dim))
        return list(snapshot.get(self.name) or [])


def layer_profile(stats: Mapping[str, float], name: str) -> list[float]:
    """The per-layer profile of ``name`` in flat statistics (``{"<name>[/<site>]/layer_<ii>": value}``, as
    ``DepthStatsCollector.compute`` returns): one value per layer that has it, in depth order; a statistic measured
    at several sites of a layer gets their mean."""
    layers: dict[int, list[float]] = {}
    for key, value in stats.items():
        split = split_layer_key(key)
        if split is not None and (split[0] == name or split[0].startswith(name + "/")):
            layers.setdefault(split[1], []).append(value)
    return [sum(values) / len(values) for _, values in sorted(layers.items())]


# ----------------------------------------------------------------------------- the registry
_REGISTRY: dict[str, LayerStatistic] = {}


def register_statistic(stat: LayerStatistic) -> LayerStatistic:
    """Adds ``stat`` to the registry (after the ones before it: the order of the study's columns and panels).
    Its name and its summaries' metric names must be new; a ``FromProfile`` source must be registered."""
    if stat.name in _REGISTRY:
        raise ValueError(f"statistic {stat.name!r} is already registered; registered: {list(_REGISTRY)}")
    taken = {s.metric(other.name): other.name for other in _REGISTRY.values() for s in other.summaries}
    clashes = {s.metric(stat.name): taken[s.metric(stat.name)] for s in stat.summaries if s.metric(stat.name) in taken}
    if clashes:
        raise ValueError(f"statistic {stat.name!r}: metric names already taken (metric: by statistic): {clashes}")
    if isinstance(stat.measure, FromProfile) and stat.measure.source not in _REGISTRY:
        raise ValueError(
            f"statistic {stat.name!r} is computed from {stat.measure.source!r}, which is not registered; "
            f"registered: {list(_REGISTRY)}"
        )
    _REGISTRY[stat.name] = stat
    return stat


def unregister_statistic(name: str) -> None:
    """Removes a statistic (a test's, or one a plugin replaces)."""
    statistic(name)
    del _REGISTRY[name]


def statistics() -> tuple[LayerStatistic, ...]:
    """Every registered statistic, in registration order."""
    return tuple(_REGISTRY.values())


def statistic(name: str) -> LayerStatistic:
    if name not in _REGISTRY:
        raise ValueError(f"unknown statistic {name!r}; registered: {list(_REGISTRY)}")
    return _REGISTRY[name]


# ----------------------------------------------------------------------------- the statistics
def _magnitude(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y.norm(dim=-1)  # [B, T]: ||y_t||_2


def _variance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y.var(dim=-1, correction=0)  # [B, T]: population variance over d


def _top2_removed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``||y_t||_2`` without the two channels of largest mean ``|y|`` over the batch; no value when ``d <= 2``."""
    if y.shape[-1] <= 2:
        return y.new_zeros(0)
    channel_mean = y.abs().flatten(0, -2).mean(dim=0)  # [d]
    keep = torch.ones_like(channel_mean, dtype=torch.bool)
    keep[channel_mean.topk(2).indices] = False
    return y[..., keep].norm(dim=-1)  # [B, T]


def _per_coordinate(magnitude: Sequence[float], dim: int) -> list[float]:
    return [v / math.sqrt(dim) for v in magnitude] if dim > 0 else []


def _angular_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 1.0 - torch.nn.functional.cosine_similarity(x, y, dim=-1, eps=1e-12)  # [B, T]


def _max_abs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y.abs().amax(dim=-1)  # [B, T]


def _site_rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(dim=-1).sqrt()


_LN_RATIO, _LN_VARIANCE = 0.2, 0.4  # docs/method.md, section 10: a 22 % ratio; twice that on a squared scale

for _stat in (
    LayerStatistic(
        "magnitude",
        "mean over tokens of ||y_t||_2",
        "the block output's magnitude (the paper's Figure 3)",
        OnBlockOutput(_magnitude),
        monitor=True,
        trajectory=True,
        summaries=(
            Summary("last", "last-layer magnitude (mean token)", _LN_RATIO, "last-layer magnitude"),
            Summary("growth", "ln magnitude growth L/4..L", _LN_RATIO),
            Summary("growth_slope", "ln magnitude slope/layer L/4..L"),
            Summary("slope", title="slope of ln magnitude vs layer (2..L)"),
        ),
    ),
    LayerStatistic(
        "median_magnitude",
        "median over tokens of ||y_t||_2, position 0 left out",
        "the magnitude of the median token: robust to the few tokens with massive activations",
        OnBlockOutput(_magnitude),
        reduction=Quantile(0.5),
        skip_tokens=1,
        trajectory=True,
        summaries=(
            Summary("last", "median token", _LN_RATIO, "last-layer median-token magnitude (position 0 excluded)"),
        ),
    ),
    LayerStatistic(
        "magnitude_per_coordinate",
        "mean over tokens of ||y_t||_2 / sqrt(d)",
        "the magnitude per coordinate: the scale to set beside a wider model's numbers",
        FromProfile("magnitude", _per_coordinate),
        summaries=(Summary("last", "per coordinate (/sqrt d)", _LN_RATIO),),
    ),
    LayerStatistic(
        "variance",
        "mean over tokens of Var_d(y_t)",
        "the block output's variance across the hidden dimension (the paper's Figure 3)",
        OnBlockOutput(_variance),
        monitor=True,
        trajectory=True,
        summaries=(
            Summary("last", "last-layer variance", _LN_VARIANCE),
            Summary("growth", "ln variance growth L/4..L", _LN_VARIANCE),
            Summary("growth_slope"),
        ),
    ),
    LayerStatistic(
        "magnitude_top2_removed",
        "mean over tokens of ||y_t||_2 without 2 channels",
        "the magnitude without the two channels of largest mean |y| over the batch (the massive channels the "
        "first blocks write dominate the plain magnitude)",
        OnBlockOutput(_top2_removed),
        trajectory=True,
        summaries=(Summary("last", "magnitude w/o top-2 channels"),),
    ),
    LayerStatistic(
        "saturation",
        "fraction of |argument| > threshold",
        "the fraction of a bounded site's arguments past the saturation threshold, mean over the layer's sites",
        ByScheme(),
        trajectory=True,
        summaries=(Summary("layer_mean", "tanh saturation", title="tanh saturation (mean over sites and layers)"),),
    ),
    LayerStatistic(
        "angular_distance",
        "mean over tokens of 1 - cos(x_t, y_t)",
        "how far a block turns the residual stream (near 0: the block barely changes its direction)",
        OnBlockOutput(_angular_distance),
        monitor=True,
    ),
    LayerStatistic(
        "max_abs",
        "max |y| over the batch",
        "the block output's largest entry",
        OnBlockOutput(_max_abs),
        reduction=MAX,
        monitor=True,
    ),
    LayerStatistic(
        "site_rms",
        "mean over tokens of sqrt(mean_d x_t^2)",
        "the root mean square of a norm site's input",
        OnSiteInput(_site_rms),
        monitor=True,
    ),
):
    register_statistic(_stat)
del _stat

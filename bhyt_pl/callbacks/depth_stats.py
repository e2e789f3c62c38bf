"""Depth-wise activation statistics (docs/method.md, section 6, the paper's Figure 3) measured on the training batch.

On a logging step the callback registers forward hooks on every transformer block (found by
``bhyt_pl.callbacks.blocks.locate_blocks``: bhyt_pl's ``Llama``, transformers decoder-only models, litgpt's
``GPT``, or a ``blocks`` argument) and on every bhyt_pl norm site, lets the normal training forward run
through them, removes them before the backward pass, reduces the sums across ranks and writes scalars
and one value-against-depth figure per statistic from rank 0. On every other step no hook is attached.
Models without bhyt_pl norm sites get the block statistics (magnitude, variance, max_abs,
angular_distance); the site statistics are skipped with one info line.

The statistics are the per-layer statistics declared in ``bhyt_pl.callbacks.layer_stats`` (each per token over the
hidden dimension, float32, reduced over the tokens of the batch as its declaration says). By default the monitor
logs the ones declared ``monitor=True``:

- ``magnitude``: ``||y_t||_2`` of the block output ``y`` (the paper's "magnitude"), mean over tokens.
- ``variance``: ``Var_d(y_t)`` (population variance, the paper's "variance"), mean over tokens.
- ``max_abs``: ``max |y|`` over the whole batch (maximum over ranks).
- ``angular_distance``: ``1 - cos(x_t, y_t)`` between block input and output (curse of depth: near 0
  means the block barely changes the residual stream's direction).
- ``site_rms/<site>``: ``sqrt(mean_d x_t^2)`` of the input of each norm site that is not an identity.

``statistics=[...]`` picks others, e.g. the depth study's ``median_magnitude`` (a quantile over tokens) and
``magnitude_top2_removed``. Whatever is picked, the scheme's own site statistics are logged too:

- ``saturation/<site>``: fraction of arguments of the bounded function with ``|arg| > saturation_threshold``
  (sites that implement ``bhyt_pl.norms.BoundedSite``: BHyT, DyT, Derf, DyISRU, SeeDNorm); for BHyT's
  site B the argument uses the approximated statistic, as the forward does.
- ``<scalar>/<site>``: the site's learnable one-element parameters as ``BoundedSite.scalars`` names them
  (``lambda`` for BHyT, ``alpha`` for DyT, ``alpha`` and ``shift`` for Derf, ``beta`` for DyISRU).
- ``bhyt_moment_ratio``: site B's approximated second moment ``m + c*lambda_A^2/kappa^2`` divided by
  the exact ``mean_d h_t^2`` (``1.0`` means the approximation of docs/method.md, section 3 is exact), averaged
  over tokens; ``bhyt_moment_ratio_of_means``: mean approximated over mean exact moment (dominated by
  the large tokens); ``bhyt_moment_ratio_first8`` and ``bhyt_moment_ratio_rest``: the averaged ratio
  over positions 0-7 and over positions 8 and later. Causal attention averages early queries over few
  keys, so a low ``first8`` against ``rest`` isolates the causal-masking part of the bias.

The statistics after ``site_rms`` come from the scheme itself (``BlockNorms.site_statistics``), so a new
scheme reports its own without an edit here; a new statistic of blocks or sites is one declaration in
``bhyt_pl.callbacks.layer_stats``. Scalars are named ``depth/<stat>[/<site>]/layer_<ii>``
(``bhyt_pl.callbacks.layer_metrics``); figures ``depth/<stat>`` go to every logger
that takes images (``bhyt_pl.callbacks.loggers``: TensorBoard, W&B, MLflow, CSV).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from bhyt_pl.callbacks.blocks import BlocksSpec, LocatedBlocks, locate_blocks
from bhyt_pl.callbacks.layer_metrics import LayerMetrics, layer_key, layer_width, split_layer_key
from bhyt_pl.callbacks.layer_stats import (
    LayerStatistic,
    Max,
    Mean,
    OnBlockOutput,
    OnSiteInput,
    Quantile,
    statistic,
    statistics,
)
from bhyt_pl.callbacks.loggers import log_figures
from bhyt_pl.norms import BlockNorms

__all__ = ["DepthStatsMonitor", "DepthStatsCollector", "SITES"]

log = logging.getLogger(__name__)

SITES = ("attn_in", "attn_out", "attn_res", "mlp_in", "mlp_out", "mlp_res")
"""Norm-site submodules of ``Block.norms`` (``layers.<i>.norms.<site>``)."""


class DepthStatsCollector:
    """Accumulates per-layer statistics from hooks on one ``Llama`` for one or more forward passes.

    Sums and token counts are kept separately so the cross-rank reduction is exact (sum the sums,
    sum the counts, then divide); a maximum is reduced with a maximum, a quantile over every rank's values.

    Args:
        model: the model to observe (its blocks are found by ``locate_blocks``), or located blocks.
        saturation_threshold: a tanh argument with ``|arg|`` above this counts as saturated.
        blocks: where the blocks are when they cannot be found (``locate_blocks``).
        statistics: the registered statistics to measure (``bhyt_pl.callbacks.layer_stats``); None: the ones
            declared ``monitor=True``. The scheme's own site statistics are measured either way.

    Example:
        >>> from bhyt_pl import Llama, LlamaConfig
        >>> model = Llama(LlamaConfig.from_name("tiny", n_layers=2, norm="bhyt"))
        >>> collector = DepthStatsCollector(model)
        >>> with collector:
        ...     _ = model(torch.randint(0, 100, (2, 16)))
        >>> sorted(collector.compute())[:2]
        ['angular_distance/layer_00', 'angular_distance/layer_01']
    """

    def __init__(
        self,
        model: nn.Module | LocatedBlocks,
        saturation_threshold: float = 2.0,
        blocks: BlocksSpec = None,
        statistics: Sequence[str] | None = None,
    ) -> None:
        self.located = model if isinstance(model, LocatedBlocks) else locate_blocks(model, blocks)
        self.saturation_threshold = saturation_threshold
        self.width = layer_width(len(self.located))
        self.metrics = LayerMetrics()
        self.statistics = resolve_statistics(statistics)
        self._block_stats = [s for s in self.statistics if isinstance(s.measure, OnBlockOutput)]
        self._site_stats = [s for s in self.statistics if isinstance(s.measure, OnSiteInput)]
        self._handles: list[RemovableHandle] = []

    # ------------------------------------------------------------------ hooks
    def attach(self) -> None:
        """Register the hooks (idempotent)."""
        if self._handles:
            return
        for i, block in enumerate(self.located):
            layer = layer_key(i, self.width)
            self._handles.append(block.register_forward_hook(self._block_hook(layer), with_kwargs=True))
            norms = self.located.block_norms(i)
            for site_name, site in self.located.norm_sites(i).items():
                self._handles.append(site.register_forward_pre_hook(self._site_hook(norms, site_name, layer)))

    def detach(self) -> None:
        """Remove every hook this collector registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def empty(self) -> bool:
        return self.metrics.empty

    def __enter__(self) -> DepthStatsCollector:
        self.attach()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def _block_hook(self, layer: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not self._block_stats:
                return
            with torch.no_grad():
                x = _residual(args, kwargs).detach().float()  # [B, T, d], block input
                y = (output[0] if isinstance(output, (tuple, list)) else output).detach().float()  # [B, T, d]
                for stat in self._block_stats:
                    self._add(stat, f"{stat.name}/{layer}", stat.measure.fn(x, y))

        return hook

    def _site_hook(self, norms: BlockNorms, site_name: str, layer: str) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            with torch.no_grad():
                x = args[0].detach().float()  # [..., d]
                for stat in self._site_stats:
                    self._add(stat, f"{stat.name}/{site_name}/{layer}", stat.measure.fn(x))
                # the scheme's own statistics of this site (saturation, lambdas, BHyT's moment ratios)
                for key, (total, count) in norms.site_statistics(site_name, args, self.saturation_threshold).items():
                    self.metrics.add(f"{key}/{layer}", total, count)

        return hook

    def _add(self, stat: LayerStatistic, key: str, values: torch.Tensor) -> None:
        """One pass's per-token ``values`` ([B, T] or [...]) of ``stat``, reduced as its declaration says."""
        if stat.skip_tokens and values.ndim >= 2:
            values = values[:, stat.skip_tokens :]  # leading positions of every sequence left out
        values = values.flatten()  # [N]
        if not values.numel():
            return
        if isinstance(stat.reduction, Mean):
            self.metrics.add(key, values.sum(), values.numel())
        elif isinstance(stat.reduction, Max):
            self.metrics.max(key, values.amax())
        elif isinstance(stat.reduction, Quantile):
            self.metrics.sample(key, values, stat.reduction.q)
        else:  # LayerStatistic checks its reduction: a new kind of reduction needs its branch here
            raise TypeError(f"statistic {stat.name!r}: no accumulation for reduction {stat.reduction!r}")

    # ------------------------------------------------------------------ results
    def reset(self) -> None:
        self.metrics.reset()

    def compute(self, all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Means (and maxima) per key, reduced over ranks when ``all_gather`` is given.

        Args:
            all_gather: maps a local tensor [K] to the stacked tensors of every rank [world, K]
                (``trainer.strategy.all_gather``); every rank must call ``compute`` together.

        Returns:
            ``{"magnitude/layer_00": value, ...}``.
        """
        return self.metrics.compute(all_gather)


def resolve_statistics(names: Sequence[str] | None) -> tuple[LayerStatistic, ...]:
    """The registered statistics named (``ValueError`` naming an unknown one and the registered ones); None: the
    ones declared ``monitor=True``. Statistics the hooks do not measure (``ByScheme``, ``FromProfile``) are kept
    out: the scheme reports the former, the latter are computed from another's profile."""
    if names is None:
        chosen = [s for s in statistics() if s.monitor]
    else:
        chosen = [statistic(name) for name in names]
    return tuple(s for s in chosen if s.collected)


def _residual(args: tuple, kwargs: dict) -> torch.Tensor:
    """A block's residual-stream input: its first positional argument, else ``hidden_states`` (transformers
    calls some layers with keywords only), else its first tensor keyword argument."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    return next(v for v in kwargs.values() if isinstance(v, torch.Tensor))


class DepthStatsMonitor(L.Callback):
    """Logs depth-wise activation statistics of the actual training batch at step 1 and every
    ``every_n_steps`` optimizer steps (statistics listed in this module's docstring).

    Hooks are attached only on logging steps, on the first micro-batch of that optimizer step, and
    removed before its backward pass; the forward code is untouched and nothing is stored on modules.
    Under DDP/FSDP2 every rank collects on the same steps, one ``all_gather`` reduces the sums, and
    rank 0 writes ``depth/<stat>[/<site>]/layer_<ii>`` scalars to every logger and one
    value-against-depth figure per statistic (``depth/<stat>``) to every logger that takes images.

    Args:
        every_n_steps: log every this many optimizer steps (plus step 1 when ``log_first_step``).
        log_first_step: also log at step 1 (the statistics of the initial weights).
        validation: also log the statistics of the first validation batch of every validation run,
            under ``depth_val/...``.
        figures: draw the figures (matplotlib) for TensorBoard, W&B, MLflow and CSV loggers.
        saturation_threshold: ``|tanh argument|`` above which a coordinate counts as saturated.
        blocks: where the transformer blocks are, for models the locator does not know: a dotted path
            from the LightningModule (``"net.decoder.layers"``) or a callable returning them
            (``bhyt_pl.callbacks.blocks.locate_blocks``). None finds bhyt_pl, transformers and litgpt blocks.
        statistics: names of registered statistics to log (``bhyt_pl.callbacks.layer_stats``); None: the ones
            declared ``monitor=True`` (magnitude, variance, max_abs, angular_distance, site_rms). The scheme's own
            site statistics are logged either way.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[DepthStatsMonitor(every_n_steps=100)], max_steps=1)
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        log_first_step: bool = True,
        validation: bool = False,
        figures: bool = True,
        saturation_threshold: float = 2.0,
        blocks: BlocksSpec = None,
        statistics: Sequence[str] | None = None,
    ) -> None:
        if not (isinstance(every_n_steps, int) and every_n_steps >= 1):
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}")
        if not saturation_threshold > 0:
            raise ValueError(f"saturation_threshold must be > 0, got {saturation_threshold}")
        resolve_statistics(statistics)  # an unknown name fails here, before any training
        self.every_n_steps = every_n_steps
        self.log_first_step = log_first_step
        self.validation = validation
        self.figures = figures
        self.saturation_threshold = saturation_threshold
        self.blocks = blocks
        self.statistics = None if statistics is None else list(statistics)
        self._collector: DepthStatsCollector | None = None
        self._pending_step: int | None = None
        self._last_logged_step = -1
        self._warned_no_stats = False
        self._disabled = False

    def should_log(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1-based) is a logging step."""
        return (step == 1 and self.log_first_step) or step % self.every_n_steps == 0

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._collector = None  # the model may be built in configure_model, after setup: resolve lazily
        self._disabled = False

    def _get_collector(self, pl_module: L.LightningModule) -> DepthStatsCollector | None:
        if self._collector is None and not self._disabled:
            try:
                located = locate_blocks(pl_module, self.blocks)
            except ValueError as err:
                if self.blocks is not None:
                    raise
                self._disabled = True
                rank_zero_warn(f"DepthStatsMonitor: {err}; nothing to log")
                return None
            if any(getattr(block, "_compiled_call_impl", None) is not None for block in located):
                # ``Module.compile`` traces the hook dictionaries into the graph and does not guard on
                # them, so hooks attached for one step would be ignored or outlive it: log nothing
                self._disabled = True
                rank_zero_warn("DepthStatsMonitor: blocks are compiled (model.compile=true); depth statistics are off")
                return None
            if not located.has_norm_sites:
                rank_zero_info(
                    f"DepthStatsMonitor: the blocks at {located.path} have no bhyt_pl norm sites; site statistics "
                    "(site_rms, saturation, lambda/alpha, BHyT moment ratio) are skipped"
                )
            self._collector = DepthStatsCollector(located, self.saturation_threshold, statistics=self.statistics)
        return self._collector

    # ------------------------------------------------------------------ training
    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step + 1  # the optimizer step this batch contributes to
        first_micro_batch = batch_idx % trainer.accumulate_grad_batches == 0
        if not first_micro_batch or step == self._last_logged_step or not self.should_log(step):
            return
        collector = self._get_collector(pl_module)
        if collector is not None:
            collector.reset()
            collector.attach()
            self._pending_step = step

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._collector is not None:
            self._collector.detach()  # before backward: activation recomputation must not fire them again

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._pending_step is None or self._collector is None:
            return
        step, self._pending_step = self._pending_step, None
        self._collector.detach()
        self._last_logged_step = step
        self._write(trainer, "depth", step)

    # ------------------------------------------------------------------ validation
    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self.validation or trainer.sanity_checking or batch_idx != 0 or dataloader_idx != 0:
            return
        collector = self._get_collector(pl_module)
        if collector is not None:
            collector.reset()
            collector.attach()

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._collector is None or not self._collector.attached:
            return
        self._collector.detach()
        self._write(trainer, "depth_val", trainer.global_step)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._collector is not None:
            self._collector.detach()

    # ------------------------------------------------------------------ output
    def _write(self, trainer: L.Trainer, prefix: str, step: int) -> None:
        collector = self._collector
        if collector.empty:  # the same on every rank (same model), so no rank waits in a collective
            if not self._warned_no_stats:
                self._warned_no_stats = True
                rank_zero_warn("DepthStatsMonitor: the hooks saw no forward pass of the model's blocks; nothing logged")
            return
        # every rank reaches this on the same steps, so the collective cannot deadlock
        all_gather = trainer.strategy.all_gather if trainer.world_size > 1 else None
        stats = collector.compute(all_gather)
        collector.reset()
        if not trainer.is_global_zero:
            return
        metrics = {f"{prefix}/{key}": value for key, value in stats.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if self.figures:
            log_figures(
                trainer.loggers,
                lambda: {f"{prefix}/{name}": fig for name, fig in depth_figures(stats, step, prefix).items()},
                step,
            )


def depth_figures(stats: dict[str, float], step: int, prefix: str = "depth") -> dict[str, Any]:
    """One matplotlib figure per statistic: value against layer index, one line per site.

    Args:
        stats: ``{"<stat>[/<site>]/layer_<ii>": value}`` as ``DepthStatsCollector.compute`` returns.
        step: the optimizer step (for the title).

    Returns:
        ``{"<stat>": Figure}`` (no pyplot state is created: figures are plain ``Figure`` objects).
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for key, value in stats.items():
        split = split_layer_key(key)
        if split is None:  # not a per-layer statistic
            continue
        head, layer = split
        stat, _, site = head.partition("/")
        series[stat][site][layer] = value
    figures = {}
    for stat, lines in sorted(series.items()):
        figure = Figure(figsize=(4.5, 3.0), dpi=80, layout="constrained")
        ax = figure.add_subplot()
        for site, points in sorted(lines.items()):
            layers = sorted(points)
            ax.plot(layers, [points[i] for i in layers], marker="o", markersize=3, label=site or None)
        if any(lines):
            ax.legend(fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.set_xlabel("layer")
        ax.set_ylabel(stat)
        ax.set_title(f"{prefix}/{stat}, step {step}", fontsize=9)
        ax.grid(alpha=0.3)
        figures[stat] = figure
    return figures

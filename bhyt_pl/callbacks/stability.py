"""Where training turns unstable, against depth: gradients per block and per norm site, attention
entropy, outlier activations, and loss / gradient-norm spikes.

Statistics of a logging step (step 1 and every ``every_n_steps`` optimizer steps), from the training
batch, per block ``i`` (scalars ``stability/<stat>[/<site>]/layer_<ii>``, as ``depth/...``):

- ``grad_norm``: L2 norm of the gradient of all the block's parameters, after accumulation and before
  clipping (sharded parameters: the norm of the full tensor). ``grad_norm/<site>`` the same for the
  parameters of one norm site (gains, lambdas, alphas); ``grad_norm/embed`` and ``grad_norm/final_norm``
  for the parameters outside the blocks.
- ``act_grad_norm``: the per-token L2 norm of ``dL/dy`` for the block output ``y``, averaged over tokens
  (``L`` the mean loss over the first micro-batch of the step on every rank; a tensor hook on ``y``).
- ``attn_entropy``: entropy in nats of each query's causal attention distribution, averaged over heads
  and query positions, from the block's own queries and keys (recomputed from the block input with
  ``norms.pre_attn`` and ``Attention.qk``, exactly as the forward computes them). Exact, without
  materialising probabilities: ``H = logsumexp_j s_j - sum_j p_j s_j`` and ``sum_j p_j s_j = scale *
  q . sum_j p_j k_j``, an attention output with the keys as values; one fused attention call (values =
  keys) returns both that output and the log-sum-exp. ``attn_entropy_normalized``: ``H / log(t + 1)``
  for query position ``t`` (its number of visible keys), averaged over positions ``t >= 1``.
- ``kurtosis``: excess kurtosis of ``y_t`` across the hidden dimension (``m4 / m2^2 - 3``, central
  moments), averaged over tokens; 0 for a Gaussian, large when a few channels carry outliers.
- ``max_over_median``: ``max_d |y_t| / median_d |y_t|`` per token, averaged over tokens (massive
  activations).

Spikes, on every optimizer step, from two scalars and no hooks: the training loss (mean over the
micro-batches of the step and over ranks) and the total gradient norm before clipping. A value is a
spike when it exceeds the mean of the previous ``window`` values by more than ``sigma`` standard
deviations (OLMo-core's definition: 128 and 6); non-finite values are spikes too. Logged at Lightning's
``log_every_n_steps`` cadence, on logging steps and on every spike: ``stability/loss_spikes`` and
``stability/grad_norm_spikes`` (cumulative counts), ``stability/loss_zscore``, ``stability/grad_norm_zscore``
and ``stability/grad_norm_total``. The windows and counts are the callback's state in checkpoints, so a
resumed run continues them.

Figures (TensorBoard, W&B, MLflow, CSV: ``bhyt_pl.callbacks.loggers``): one value-against-depth
figure per statistic, ``stability/<stat>``.

Distributed (DDP, FSDP2): sums and token counts are summed over ranks (so means are exact), gradient
norms of sharded parameters are summed shard by shard into full-tensor norms, and rank 0 writes.
Compiled blocks (``model.compile``) are measured too: the callback hooks only the block itself, whose
hooks ``torch.compile`` honours, and computes every statistic eagerly outside the compiled graph
(``torch.compiler.disable``), recomputing what it needs from the block input; nothing inside a block
is hooked. A logging step's batch runs with the compiler's ``force_eager`` stance (restored after the
batch): hooks added for that one step would otherwise make every compiled block recompile, each time,
with graph breaks; the other steps run compiled.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from bhyt_pl.callbacks.attention_entropy import causal_attention_entropy
from bhyt_pl.callbacks.blocks import BlocksSpec, LocatedBlocks, locate_blocks
from bhyt_pl.callbacks.depth_stats import SITES, depth_figures
from bhyt_pl.callbacks.layer_metrics import LayerMetrics, layer_key, layer_width
from bhyt_pl.callbacks.loggers import log_figures
from bhyt_pl.norms import BlockNorms

__all__ = [
    "SpikeDetector",
    "StabilityMonitor",
    "causal_attention_entropy",
    "token_excess_kurtosis",
    "token_max_over_median",
]

log = logging.getLogger(__name__)


def _blocks(pl_module: L.LightningModule, blocks: BlocksSpec = None) -> LocatedBlocks | None:
    """The transformer blocks of the LightningModule, first to last (``locate_blocks``: bhyt_pl, transformers
    and litgpt models, or ``blocks``); None when none are found and ``blocks`` was not given."""
    try:
        return locate_blocks(pl_module, blocks)
    except ValueError:
        if blocks is not None:
            raise
        return None


# ----------------------------------------------------------------------------- statistics
def token_excess_kurtosis(y: torch.Tensor) -> torch.Tensor:
    """Excess kurtosis ``m4 / m2^2 - 3`` (central, population moments) of each token of ``y`` [..., d]
    across ``d``, float32; shape [...]."""
    y = y.float()
    centred = y - y.mean(dim=-1, keepdim=True)
    m2 = centred.pow(2).mean(dim=-1)
    m4 = centred.pow(4).mean(dim=-1)
    return m4 / m2.pow(2).clamp_min(1e-30) - 3.0


def token_max_over_median(y: torch.Tensor) -> torch.Tensor:
    """``max_d |y_t| / median_d |y_t|`` for each token of ``y`` [..., d] (median of an even count: the mean
    of the two middle values, as numpy), float32; shape [...]."""
    a = y.float().abs()
    d = a.shape[-1]
    low = a.kthvalue((d + 1) // 2, dim=-1).values
    high = a.kthvalue(d // 2 + 1, dim=-1).values
    return a.amax(dim=-1) / ((low + high) / 2).clamp_min(1e-30)


# ----------------------------------------------------------------------------- spikes
class SpikeDetector:
    """Counts values above the rolling mean + ``sigma`` standard deviations of the previous ``window``
    values (needs ``min_history`` of them first); non-finite values count as spikes and stay out of the
    window. ``state_dict``/``load_state_dict`` carry the window and the count.

    Example:
        >>> detector = SpikeDetector(window=4, sigma=3.0, min_history=4)
        >>> [detector.update(v) for v in (1.0, 1.1, 0.9, 1.0, 9.0)][-1]
        True
        >>> detector.count
        1
    """

    def __init__(self, window: int = 128, sigma: float = 6.0, min_history: int | None = None) -> None:
        self.window, self.sigma = window, sigma
        self.min_history = window if min_history is None else min_history
        self.history: deque[float] = deque(maxlen=window)
        self.count = 0
        self.zscore = float("nan")

    def update(self, value: float) -> bool:
        """Record ``value``; True when it is a spike. ``zscore`` holds its z-score (NaN below 2 values)."""
        n = len(self.history)
        mean = math.fsum(self.history) / n if n else float("nan")
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in self.history) / (n - 1)) if n > 1 else float("nan")
        self.zscore = (value - mean) / std if n > 1 and std > 0 else float("nan")
        if not math.isfinite(value):
            self.count += 1
            return True
        spike = n >= max(2, self.min_history) and value > mean + self.sigma * std
        self.count += spike
        self.history.append(value)
        return spike

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = deque(state["history"], maxlen=self.window)
        self.count = int(state["count"])


# ----------------------------------------------------------------------------- the callback
class StabilityMonitor(L.Callback):
    """Logs gradient norms, attention entropy and outlier statistics by depth on logging steps, and
    counts loss and gradient-norm spikes on every step (statistics listed in this module's docstring).

    Block hooks exist only during the forward of the first micro-batch of a logging step (tensor hooks
    on that forward's block outputs fire in its backward); the spike detectors read the loss and the
    gradients, no hooks. Every rank takes part in one reduction per optimizer step (none on one device).

    Args:
        every_n_steps: compute the per-layer statistics every this many optimizer steps.
        log_first_step: also at step 1 (the initial weights).
        figures: draw value-against-depth figures for TensorBoard, W&B, MLflow and CSV loggers.
        spike_window: previous steps the rolling mean and standard deviation cover.
        spike_sigma: a value above mean + ``spike_sigma`` standard deviations is a spike.
        spike_min_history: values needed before spikes are counted (default: a full window).
        entropy: compute the attention entropy (one extra attention pass per block on logging steps) where
            the block exposes bhyt_pl's ``norms.pre_attn`` and ``attn.qk``; other models log the rest.
        blocks: where the transformer blocks are, for models the locator does not know: a dotted path from
            the LightningModule or a callable (``bhyt_pl.callbacks.blocks.locate_blocks``).

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[StabilityMonitor(every_n_steps=100)], max_steps=1)
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        log_first_step: bool = True,
        figures: bool = True,
        spike_window: int = 128,
        spike_sigma: float = 6.0,
        spike_min_history: int | None = None,
        entropy: bool = True,
        blocks: BlocksSpec = None,
    ) -> None:
        problems = []
        if not (isinstance(every_n_steps, int) and every_n_steps >= 1):
            problems.append(f"every_n_steps must be an int >= 1, got {every_n_steps!r}")
        if not (isinstance(spike_window, int) and spike_window >= 2):
            problems.append(f"spike_window must be an int >= 2, got {spike_window!r}")
        if not spike_sigma > 0:
            problems.append(f"spike_sigma must be > 0, got {spike_sigma}")
        if spike_min_history is not None and not (isinstance(spike_min_history, int) and 2 <= spike_min_history):
            problems.append(f"spike_min_history must be an int >= 2 or None (a full window), got {spike_min_history!r}")
        if problems:
            raise ValueError("invalid StabilityMonitor arguments:\n  - " + "\n  - ".join(problems))
        self.every_n_steps, self.log_first_step, self.figures, self.entropy = (
            every_n_steps,
            log_first_step,
            figures,
            entropy,
        )
        self.spike_window, self.spike_sigma, self.spike_min_history = spike_window, spike_sigma, spike_min_history
        self.blocks = blocks
        self.loss_spikes = SpikeDetector(spike_window, spike_sigma, spike_min_history)
        self.grad_norm_spikes = SpikeDetector(spike_window, spike_sigma, spike_min_history)
        self._handles: list[RemovableHandle] = []
        self._metrics = LayerMetrics()
        self._groups: tuple[list[str], list[nn.Parameter], torch.Tensor, torch.Tensor] | None = None
        self._grad_sq: torch.Tensor | None = None  # per group, then the total; set before clipping
        self._loss_sum, self._loss_count = 0.0, 0
        self._pending_step: int | None = None
        self._stance: Any = None  # the force_eager stance of a logging step's batch, which restores the previous one
        self._grad_scale = 1.0
        self._width = 2
        self._warned: set[str] = set()

    def should_log(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1-based) computes the per-layer statistics."""
        return (step == 1 and self.log_first_step) or step % self.every_n_steps == 0

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"loss": self.loss_spikes.state_dict(), "grad_norm": self.grad_norm_spikes.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loss_spikes.load_state_dict(state_dict["loss"])
        self.grad_norm_spikes.load_state_dict(state_dict["grad_norm"])

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._groups = None  # the model may be built in configure_model, after setup: resolve lazily

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(f"StabilityMonitor: {message}")

    # ------------------------------------------------------------------ parameter groups
    def _parameter_groups(self, pl_module: L.LightningModule):
        """Group names, the parameters, and (parameter index, group index) pairs: ``layer_ii`` (the whole
        block), ``<site>/layer_ii`` (one norm site), ``embed`` and ``final_norm`` (outside the blocks)."""
        if self._groups is not None:
            return self._groups
        blocks = _blocks(pl_module, self.blocks) or ()
        self._width = layer_width(len(blocks))
        params = [p for p in pl_module.parameters() if p.requires_grad]
        index = {id(p): i for i, p in enumerate(params)}
        names: list[str] = []
        pairs: list[tuple[int, int]] = []

        def add(name: str, module_params) -> None:
            ids = [index[id(p)] for p in module_params if id(p) in index]
            if ids:
                names.append(name)
                pairs.extend((i, len(names) - 1) for i in ids)

        in_blocks: set[int] = set()
        for i, block in enumerate(blocks):
            layer = layer_key(i, self._width)
            block_params = list(block.parameters())
            in_blocks.update(id(p) for p in block_params)
            add(layer, block_params)
            sites = blocks.norm_sites(i)  # bhyt_pl blocks only
            for site in SITES:
                if site in sites:
                    add(f"{site}/{layer}", sites[site].parameters())
        model = getattr(pl_module, "model", pl_module)
        final_norm = getattr(model, "final_norm", None)
        final_ids = {id(p) for p in final_norm.parameters()} if isinstance(final_norm, nn.Module) else set()
        add("final_norm", [p for p in params if id(p) in final_ids])
        add("embed", [p for p in params if id(p) not in in_blocks and id(p) not in final_ids])
        param_idx = torch.tensor([i for i, _ in pairs], dtype=torch.long)
        group_idx = torch.tensor([g for _, g in pairs], dtype=torch.long)
        self._groups = (names, params, param_idx, group_idx)
        return self._groups

    # ------------------------------------------------------------------ hooks of a logging step
    def _attach(self, pl_module: L.LightningModule) -> None:
        blocks = _blocks(pl_module, self.blocks)
        if blocks is None or not len(blocks):
            self._warn_once("blocks", "no transformer blocks found (pass blocks=...); no per-layer statistics")
            return
        self._width = layer_width(len(blocks))
        for i, block in enumerate(blocks):
            hook = self._block_hook(blocks.block_norms(i), blocks.attention(i), layer_key(i, self._width))
            # prepend: run before FSDP2's post-forward hook reshards the block's parameters
            self._handles.append(block.register_forward_hook(hook, prepend=True, with_kwargs=True))

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _block_hook(self, norms: BlockNorms | None, attn: nn.Module | None, layer: str) -> Callable:
        @torch.compiler.disable  # eager, outside a compiled block's graph
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            if not isinstance(output, torch.Tensor):
                return
            with torch.no_grad():
                y = output.detach().flatten(0, -2)  # [N, d]
                n = y.shape[0]
                self._metrics.add(f"kurtosis/{layer}", token_excess_kurtosis(y).sum(), n)
                self._metrics.add(f"max_over_median/{layer}", token_max_over_median(y).sum(), n)
                if self.entropy:
                    self._entropy(module, norms, attn, layer, args, kwargs)
            if output.requires_grad:
                output.register_hook(self._grad_hook(layer))

        return hook

    def _entropy(
        self, block: nn.Module, norms: BlockNorms | None, attn: nn.Module | None, layer: str, args: tuple, kwargs: dict
    ) -> None:
        x = args[0] if args else kwargs.get("x")
        cos, sin = (args[1], args[2]) if len(args) >= 3 else (kwargs.get("cos"), kwargs.get("sin"))
        cache = args[3] if len(args) >= 4 else kwargs.get("cache")
        if norms is None or not hasattr(attn, "qk") or x is None or cos is None or cache is not None:
            self._warn_once("entropy", f"cannot recompute queries and keys of {type(block).__name__}; no attn_entropy")
            return
        u, _ = norms.pre_attn(x)  # the attention input, as the block computed it
        q, k = attn.qk(u, cos, sin)  # [B, H, T, hd], [B, K, T, hd]
        entropy = causal_attention_entropy(q, k, attn.softmax_scale)  # [B, H, T], at the attention's actual scale
        self._metrics.add(f"attn_entropy/{layer}", entropy.sum(), entropy.numel())
        T = entropy.shape[-1]
        if T > 1:
            visible = torch.arange(2, T + 1, device=entropy.device, dtype=torch.float32)  # keys seen by t = 1..T-1
            normalized = entropy[..., 1:] / visible.log()
            self._metrics.add(f"attn_entropy_normalized/{layer}", normalized.sum(), normalized.numel())

    def _grad_hook(self, layer: str) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            with torch.no_grad():
                g = (
                    grad.detach().float().flatten(0, -2) * self._grad_scale
                )  # [N, d], dL/dy of the micro-batch mean loss
                self._metrics.add(f"act_grad_norm/{layer}", g.norm(dim=-1).sum(), g.shape[0])

        return hook

    # ------------------------------------------------------------------ training hooks
    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step + 1  # the optimizer step this batch contributes to
        if batch_idx % trainer.accumulate_grad_batches != 0 or not self.should_log(step):
            return
        self._metrics.reset()
        # Lightning divides the loss by the accumulation count before backward, a grad scaler multiplies it,
        # and the data-parallel loss is the mean of the ranks' losses: report dL/dy of the global mean loss
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        loss_scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        self._grad_scale = trainer.accumulate_grad_batches / (loss_scale * trainer.world_size)
        self._attach(pl_module)
        self._pending_step = step
        self._stance = torch.compiler.set_stance("force_eager")

    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._detach()  # activation recomputation in backward must not fire the forward hooks again

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # after accumulation, before clipping: the squared gradient norms of this rank's shards per group
        names, params, param_idx, group_idx = self._parameter_groups(pl_module)
        grads, weights = [], []
        for p in params:
            if p.grad is None:
                continue
            g = p.grad
            to_local = getattr(g, "to_local", None)
            if callable(to_local):  # DTensor (FSDP2): a shard; count each element once over the mesh
                replicas = math.prod(g.device_mesh.size(d) for d, pl in enumerate(g.placements) if pl.is_replicate())
                grads.append(to_local())
                weights.append(1.0 / replicas)
            else:  # a plain tensor: the same on every rank (DDP all-reduced it), counted once over the world
                grads.append(g)
                weights.append(1.0 / trainer.world_size)
        device = params[0].device if params else torch.device("cpu")
        present = torch.zeros(len(params), dtype=torch.bool)
        present[[i for i, p in enumerate(params) if p.grad is not None]] = True
        sq = torch.zeros(len(params), dtype=torch.float64, device=device)
        if grads:
            norms = torch._foreach_norm([g.float() if g.dtype != torch.float64 else g for g in grads])
            local = torch.stack([n.to(device, torch.float64) for n in norms]).pow(2)
            sq[present.to(device)] = local * torch.tensor(weights, dtype=torch.float64, device=device)
        groups = torch.zeros(len(names), dtype=torch.float64, device=device).index_add_(
            0, group_idx.to(device), sq[param_idx.to(device)]
        )
        self._grad_sq = torch.cat([groups, sq.sum().reshape(1)])

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._restore_stance()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss_sum += float(loss.detach().float())
            self._loss_count += 1
        if self._grad_sq is None:  # no optimizer step on this micro-batch yet
            return
        self._detach()
        grad_sq, self._grad_sq = self._grad_sq, None
        step, logging_step = trainer.global_step, self._pending_step is not None
        self._pending_step = None
        loss_mean = self._loss_sum / max(self._loss_count, 1)
        self._loss_sum, self._loss_count = 0.0, 0
        names = self._groups[0]
        if not logging_step:
            grad_sq = grad_sq[-1:]
            self._metrics.reset()
        device = grad_sq.device
        packed = torch.cat(
            [
                grad_sq,
                torch.tensor([loss_mean / trainer.world_size], dtype=torch.float64, device=device),
                self._metrics.pack(device),
            ]
        )
        if trainer.world_size > 1:  # every rank reaches this on the same steps: one collective
            packed = trainer.strategy.reduce(packed, reduce_op="sum")
        values = packed.cpu().tolist()
        g = len(grad_sq)
        total_norm, loss_value = math.sqrt(values[g - 1]), values[g]
        stats = self._metrics.unpack(values[g + 1 :])
        if logging_step:
            stats.update({f"grad_norm/{name}": math.sqrt(v) for name, v in zip(names, values[: g - 1])})
        self._metrics.reset()
        loss_spike = self.loss_spikes.update(loss_value)
        grad_spike = self.grad_norm_spikes.update(total_norm)
        if not trainer.is_global_zero:
            return
        metrics = {f"stability/{k}": v for k, v in stats.items()}
        if logging_step or loss_spike or grad_spike or step % max(trainer.log_every_n_steps, 1) == 0:
            metrics.update(
                {
                    "stability/loss_spikes": float(self.loss_spikes.count),
                    "stability/grad_norm_spikes": float(self.grad_norm_spikes.count),
                    "stability/grad_norm_total": total_norm,
                }
            )
            # a z-score needs a history (two values): before that it is NaN, which is not logged
            zscores = {"loss_zscore": self.loss_spikes.zscore, "grad_norm_zscore": self.grad_norm_spikes.zscore}
            metrics.update({f"stability/{k}": v for k, v in zscores.items() if math.isfinite(v)})
        if loss_spike or grad_spike:
            log.info("StabilityMonitor: spike at step %d (loss %.4g, grad norm %.4g)", step, loss_value, total_norm)
        if not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if logging_step and self.figures:
            per_layer = {k: v for k, v in stats.items() if "/layer_" in k}
            if per_layer:

                def draw() -> dict[str, Any]:
                    return {f"stability/{k}": fig for k, fig in depth_figures(per_layer, step, "stability").items()}

                log_figures(trainer.loggers, draw, step)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._detach()
        self._restore_stance()  # a fit that stops mid-step (an exception) leaves no stance behind

    def _restore_stance(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None

"""What a study run measures on its model, outside the training step: depth statistics and the validation loss on
fixed batches (in eval mode, no gradients), a trajectory point, layer importance, StabilityMonitor's columns from
its logged metrics, and the scheme's variance-bound diagnostic.

- depth statistics (docs/method.md, section 6, paper Figure 3): every per-layer statistic declared in
  ``bhyt_pl.callbacks.layer_stats`` (magnitude = mean over tokens of ``||y_t||_2``, variance = mean over tokens
  of ``Var_d(y_t)``, ``y`` a block output; the median-token magnitude; the magnitude without the two largest
  channels; ...), measured by ``DepthStatsCollector`` on every fixed validation batch in eval mode, with the
  validation loss of the same forward passes (``val_loss``);
- layer importance: the loss on the first validation batch with block ``i`` replaced by the identity, minus the
  full model's, for every ``i`` (one block at a time);
- stability: the spike counts, the layer with the largest gradient norm and the last layer's attention entropy at
  each of StabilityMonitor's logging steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl.callbacks import DepthStatsCollector
from bhyt_pl.callbacks.layer_metrics import layer_key, layer_width, split_layer_key
from bhyt_pl.callbacks.layer_stats import statistics
from bhyt_pl.module import LlamaLM
from bhyt_pl.study.protocol.spec import StabilityStep, StabilitySummary, VarianceBound

__all__ = [
    "batch_losses",
    "depth_statistics",
    "layer_importance",
    "stability_summary",
    "variance_bound",
]


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # hooks inside compiled blocks would break and recompile their graphs
def depth_statistics(
    module: LlamaLM, batches: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]
) -> dict[str, float]:
    """Every registered per-layer statistic (``bhyt_pl.callbacks.layer_stats``) of ``module``'s Llama over
    ``batches``, reduced over all their tokens, in eval mode, and ``val_loss``: the token-weighted next-token
    cross-entropy of the same forward passes (as ``LlamaLM.validation_step``). Compiled blocks run eagerly here:
    the hooks see exactly what an eager run's do.

    Returns:
        ``{"magnitude/layer_00": value, "variance/layer_00": ..., ..., "val_loss": value}``.
    """
    batches = [batches] if isinstance(batches, dict) else list(batches)
    model = module.model
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        device = next(model.parameters()).device
        collector = DepthStatsCollector(model, statistics=[s.name for s in statistics() if s.collected])
        with collector:
            for batch in batches:
                logits = model(batch["input_ids"].to(device))
                if "labels" in batch:
                    labels = batch["labels"].to(device)
                    total += float(
                        F.cross_entropy(
                            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
                        )
                    )
                    count += int((labels != -100).sum())
        out = collector.compute()
        out["val_loss"] = total / count if count else math.nan
        return out
    finally:
        model.train(was_training)


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # a few forwards: not worth an inference graph
def batch_losses(module: LlamaLM, batches: Sequence[dict[str, torch.Tensor]]) -> list[float]:
    """The next-token cross-entropy of each batch (its tokens' mean, in eval mode): the validation loss's spread over
    its batches says how much of a difference between two runs the validation tokens themselves carry."""
    model = module.model
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        out = []
        for batch in batches:
            logits = model(batch["input_ids"].to(device))
            labels = batch["labels"].to(device)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
            out.append(float(loss))
        return out
    finally:
        model.train(was_training)


def stability_summary(metrics: Mapping[str, Sequence[tuple[int, float]]], n_layers: int) -> StabilitySummary:
    """StabilityMonitor's columns from its logged metrics: final spike counts and, per logging step, the
    layer (1-based) with the largest gradient norm and the last layer's attention entropy."""
    prefix = "stability/"
    block_grads = {  # grad_norm/layer_<ii>: the whole block's, not a site's
        split[1]: dict(v)
        for k, v in metrics.items()
        if (split := split_layer_key(k)) is not None and split[0] == prefix + "grad_norm"
    }
    steps = sorted({s for v in block_grads.values() for s in v})
    last = layer_key(n_layers - 1, layer_width(n_layers))
    by_step: list[StabilityStep] = []
    for step in steps:
        grads = {i: v.get(step) for i, v in block_grads.items()}
        grads = {i: g for i, g in grads.items() if g is not None and math.isfinite(g)}
        entropy = dict(metrics.get(f"{prefix}attn_entropy/{last}", [])).get(step, math.nan)
        by_step.append(
            StabilityStep(
                step=step,
                max_grad_layer=(max(grads, key=grads.__getitem__) + 1) if grads else None,
                max_grad_norm=max(grads.values()) if grads else math.nan,
                last_attn_entropy=entropy,
            )
        )

    def final(key: str) -> float:
        values = metrics.get(prefix + key, [])
        return values[-1][1] if values else 0.0

    return StabilitySummary(
        loss_spikes=int(final("loss_spikes")), grad_norm_spikes=int(final("grad_norm_spikes")), steps=by_step
    )


class _SkipBlock(nn.Module):
    """A block replaced by the identity: returns its input (the residual stream passes unchanged)."""

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x


class _CachedBlock(nn.Module):
    """A block whose output on this batch is already known: returns it without recomputing."""

    def __init__(self, output: torch.Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.output


@torch.no_grad()
def _loss_sum(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """Summed next-token cross-entropy (as ``LlamaLM.compute_loss``) over ``batch`` and the token count."""
    device = next(model.parameters()).device
    labels = batch["labels"].to(device)
    logits = model(batch["input_ids"].to(device))
    total = float(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"))
    return total, int((labels != -100).sum())


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # blocks swapped in and out: no graphs to trace for one forward each
def layer_importance(module: LlamaLM, batches: list[dict[str, torch.Tensor]]) -> tuple[float, list[float]]:
    """The full model's validation loss and, for every block ``i``, the loss with block ``i`` replaced by the
    identity minus that loss (one block at a time, eval mode). Small values: the block does little.

    Blocks before ``i`` see exactly the inputs of the full forward, so their outputs are taken from it
    rather than recomputed: half the block evaluations of ``L`` full forwards, with the same numbers.
    """
    model = module.model
    was_training = model.training
    model.eval()
    blocks = list(model.layers)
    n = len(blocks)
    base_total, count, totals = 0.0, 0, [0.0] * n
    try:
        for batch in batches:
            outputs: list[torch.Tensor] = []
            handles = [b.register_forward_hook(lambda m, a, out: outputs.append(out)) for b in blocks]
            try:
                loss, tokens = _loss_sum(model, batch)
            finally:
                for handle in handles:
                    handle.remove()
            base_total, count = base_total + loss, count + tokens
            for i in range(n):
                for j in range(i):
                    model.layers[j] = _CachedBlock(outputs[j])
                model.layers[i] = _SkipBlock()
                try:
                    totals[i] += _loss_sum(model, batch)[0]
                finally:
                    for j in range(i + 1):
                        model.layers[j] = blocks[j]
        base = base_total / max(count, 1)
        return base, [t / max(count, 1) - base for t in totals]
    finally:
        model.train(was_training)


def variance_bound(module: LlamaLM) -> VarianceBound | None:
    """The scheme's ``variance_bound`` diagnostic (BHyT: ``lambda/kappa < 1/sqrt(L)`` at the initial and the
    learned lambdas), None for schemes without one."""
    scheme = module.config.norm_scheme()
    blocks = [layer.norms for layer in module.model.layers]
    return scheme.diagnostics(module.config.n_layers, blocks).get("variance_bound")

"""Optimizer parameter groups: weight decay by a rule, not a list of names (style practice 7)."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

__all__ = ["cosine_with_warmup", "parameter_groups"]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: decay for tensors with >= 2 dims (matrices and embeddings), none for the rest.

    Every norm parameter (gains, lambdas, alphas, the embedding scale) has fewer than two dims, so
    none of them decays and a new norm scheme needs no edit here. Shared (tied) tensors appear once.
    """
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() yields each shared tensor once
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, then cosine down to ``min_lr_ratio`` at
    ``total_steps`` (and flat after). ``step`` counts optimizer steps from 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

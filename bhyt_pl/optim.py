"""Optimizer parameter groups: weight decay by a rule, not a list of names (style practice 7)."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["parameter_groups"]


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

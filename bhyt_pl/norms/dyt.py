"""Dynamic Tanh (DyT, arXiv 2503.10622): ``gamma * tanh(alpha * x) (+ beta)`` (docs/method.md, section 4)."""

from __future__ import annotations

import math

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm

__all__ = ["DyT", "DyTScheme", "EmbeddingScale"]


class DyT(nn.Module):
    """One DyT site: a learnable scalar ``alpha``, a per-channel gain and an optional bias."""

    def __init__(self, dim: int, alpha_init: float, bias: bool = False) -> None:
        super().__init__()
        self.dim, self.alpha_init = dim, alpha_init
        self.alpha = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """The tanh argument ``alpha * x`` (float32), for diagnostics."""
        return self.alpha * x.to(torch.promote_types(x.dtype, torch.float32))

    def scalars(self) -> dict[str, torch.Tensor]:
        """``{"alpha": alpha}`` for diagnostics (the ``BoundedSite`` interface)."""
        return {"alpha": self.alpha}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.tanh(self.preactivation(x))
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha_init={self.alpha_init}, bias={self.bias is not None}"


class EmbeddingScale(nn.Module):
    """Multiplies the embeddings by a learnable scalar initialised to ``sqrt(d)`` (DyT-LLaMA)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.scale = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, math.sqrt(self.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype)


@register_norm("dyt")
class DyTScheme(NormScheme):
    """DyT at both sites and as the final norm.

    Official LLaMA inits (attn/mlp/final): 7B 0.8/0.2/0.2, 13B 0.6/0.15/0.15, 34B-70B 0.2/0.05/0.05;
    wider models need smaller values. The generic default is 0.5.

    Args:
        alpha_attn: initial alpha of the site before attention.
        alpha_mlp: initial alpha of the site before the MLP.
        alpha_final: initial alpha of the final norm.
        bias: learn a per-channel bias (beta).
        embedding_scale: multiply embeddings by a learnable scalar initialised to sqrt(d); without
            it early activations are too small to train.
    """

    def __init__(
        self,
        alpha_attn: float = 0.5,
        alpha_mlp: float = 0.5,
        alpha_final: float = 0.5,
        bias: bool = False,
        embedding_scale: bool = True,
    ) -> None:
        self.alpha_attn, self.alpha_mlp, self.alpha_final = alpha_attn, alpha_mlp, alpha_final
        self.bias, self.embedding_scale = bias, embedding_scale
        self._raise_if(
            [
                f"{n} must be > 0, got {v}"
                for n, v in (("alpha_attn", alpha_attn), ("alpha_mlp", alpha_mlp), ("alpha_final", alpha_final))
                if not v > 0
            ]
        )

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=DyT(dim, self.alpha_attn, self.bias), mlp_in=DyT(dim, self.alpha_mlp, self.bias))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return DyT(dim, self.alpha_final, self.bias)

    def embedding_norm(self, dim: int) -> nn.Module:
        return EmbeddingScale(dim) if self.embedding_scale else nn.Identity()

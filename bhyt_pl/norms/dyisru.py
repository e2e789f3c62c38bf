"""Dynamic Inverse Square Root Unit (DyISRU, arXiv 2503.21708): ``gamma * sqrt(d) * x / sqrt(beta + x^2)``.

The element-wise counterpart of RMSNorm: RMSNorm's coordinate is ``x_i / sqrt((x_i^2 + C_i) / d)``
with ``C_i`` the sum of the other coordinates' squares; promoting ``C_i`` to one learnable scalar
``beta`` per site removes the reduction over ``d``. ``beta`` starts at ``d`` (what ``C_i`` is for
unit-RMS inputs) and DyT-LLaMA's learnable ``sqrt(d)`` embedding scale brings the inputs near unit
RMS at the start (docs/method.md, section 4).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.dyt import EmbeddingScale

__all__ = ["DyISRU", "DyISRUScheme"]


class DyISRU(nn.Module):
    """One DyISRU site: a learnable scalar ``beta`` and a per-channel gain.

    Args:
        dim: hidden size ``d``.
        beta_init: initial ``beta``; ``None`` for ``d``.
    """

    def __init__(self, dim: int, beta_init: float | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.beta_init = float(dim) if beta_init is None else beta_init
        self.beta = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.beta, self.beta_init)
        nn.init.ones_(self.weight)

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """The ISRU argument ``z = x / sqrt(beta)`` (``ISRU(z) = z / sqrt(1 + z^2)``), float32 or wider."""
        return x.to(torch.promote_types(x.dtype, torch.float32)) * torch.rsqrt(self.beta)

    def scalars(self) -> dict[str, torch.Tensor]:
        """``{"beta": beta}`` for diagnostics (the ``BoundedSite`` interface)."""
        return {"beta": self.beta}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = self.weight * (math.sqrt(self.dim) * xf * torch.rsqrt(self.beta + xf * xf))
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, beta_init={self.beta_init:g}"


@register_norm("dyisru")
class DyISRUScheme(NormScheme):
    """DyISRU at both sites and as the final norm.

    Args:
        beta_init: initial ``beta`` of every site; ``None`` (default) for ``d``, the sum of the other
            coordinates' squares of a unit-RMS input.
        embedding_scale: multiply embeddings by a learnable scalar initialised to sqrt(d) (as DyT).
    """

    def __init__(self, beta_init: float | None = None, embedding_scale: bool = True) -> None:
        self.beta_init, self.embedding_scale = beta_init, embedding_scale
        problems = []
        if beta_init is not None and not beta_init > 0:
            problems.append(f"beta_init must be > 0 or None (for d), got {beta_init}")
        self._raise_if(problems)

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=DyISRU(dim, self.beta_init), mlp_in=DyISRU(dim, self.beta_init))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return DyISRU(dim, self.beta_init)

    def embedding_norm(self, dim: int) -> nn.Module:
        return EmbeddingScale(dim) if self.embedding_scale else nn.Identity()

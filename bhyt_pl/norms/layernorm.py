"""LayerNorm (mean and variance) at both sites and after the last block (docs/method.md, section 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm

__all__ = ["LayerNorm", "LayerNormScheme"]


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed in float32 and cast back, with a fixed output ``scale`` (used by LNS)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False, scale: float = 1.0) -> None:
        super().__init__(dim, eps=eps, bias=bias)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        w = self.weight.to(dtype) if self.weight is not None else None
        b = self.bias.to(dtype) if self.bias is not None else None
        y = F.layer_norm(x.to(dtype), self.normalized_shape, w, b, self.eps).to(x.dtype)
        return y * self.scale if self.scale != 1.0 else y


@register_norm("layernorm")
class LayerNormScheme(NormScheme):
    """Pre-LN with LayerNorm.

    Args:
        eps: LayerNorm epsilon.
        bias: learn a bias (Llama has none; off by default).
    """

    def __init__(self, eps: float = 1e-5, bias: bool = False) -> None:
        self.eps, self.bias = eps, bias
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=LayerNorm(dim, self.eps, self.bias), mlp_in=LayerNorm(dim, self.eps, self.bias))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return LayerNorm(dim, self.eps, self.bias)

"""RMSNorm (Pre-LN Llama): ``gamma * x * rsqrt(mean(x^2) + eps)`` with the statistic in float32."""

from __future__ import annotations

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm, second_moment

__all__ = ["RMSNorm", "RMSNormScheme"]


class RMSNorm(nn.Module):
    """Root-mean-square norm, numerically as Hugging Face's ``LlamaRMSNorm``.

    Args:
        dim: hidden size ``d``.
        eps: added to ``mean(x^2)`` inside the rsqrt.
        scale: a fixed (non-learnable) output multiplier, used by LayerNorm Scaling.
    """

    def __init__(self, dim: int, eps: float = 1e-5, scale: float = 1.0) -> None:
        super().__init__()
        self.dim, self.eps, self.scale = dim, eps, scale
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., d]; the statistic and the product in float32, cast back before the gain (as HF does)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = (xf * torch.rsqrt(second_moment(x) + self.eps)).to(x.dtype)
        y = self.weight * y
        return y * self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        s = f"{self.dim}, eps={self.eps}"
        return s + (f", scale={self.scale:.4g}" if self.scale != 1.0 else "")


@register_norm("rmsnorm")
class RMSNormScheme(NormScheme):
    """Pre-LN with RMSNorm at both sites of every block and after the last block (docs/method.md, section 4).

    Args:
        eps: RMSNorm epsilon (Llama-3.2 uses 1e-5).
    """

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=RMSNorm(dim, self.eps), mlp_in=RMSNorm(dim, self.eps))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

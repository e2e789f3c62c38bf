"""SSNorm, Single-Scale RMSNorm from "Outlier-Safe Pre-Training" (arXiv 2506.19697): RMSNorm whose gain is
one scalar instead of a vector, so no channel can be scaled up on its own into an activation outlier
(docs/method.md, the newer schemes). Pre-LN placement and the final norm as ``rmsnorm``."""

from __future__ import annotations

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm, second_moment

__all__ = ["SSNorm", "SSNormScheme"]


class SSNorm(nn.Module):
    """``w * x * rsqrt(mean(x^2) + eps)`` with one learnable scalar ``w`` (a ``[1]`` tensor, init 1;
    FSDP2 refuses 0-d parameters); the statistic in float32, cast back before the gain, as ``RMSNorm``.

    Args:
        dim: hidden size ``d`` (for ``extra_repr``; the gain does not depend on it).
        eps: added to ``mean(x^2)`` inside the rsqrt.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return self.weight * (xf * torch.rsqrt(second_moment(x) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, scalar gain"


@register_norm("ssnorm")
class SSNormScheme(NormScheme):
    """Pre-LN with single-scale RMSNorms at both sites of every block and after the last block.

    Args:
        eps: epsilon (the paper's 1e-6).
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=SSNorm(dim, self.eps), mlp_in=SSNorm(dim, self.eps))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return SSNorm(dim, self.eps)

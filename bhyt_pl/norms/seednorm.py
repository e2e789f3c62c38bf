"""SeeDNorm, Self-Rescaled Dynamic Normalization (arXiv 2510.22777, ICLR 2026).

``[tanh(x . beta) * alpha + gamma] * x / RMS(x)`` with ``beta``, ``alpha``, ``gamma`` vectors of
width ``d``: ``x . beta`` is one scalar per token, so the gain becomes input-dependent and the
token's norm information re-enters the forward pass. With ``beta = 0``, ``alpha = 1``, ``gamma = 1``
at init it equals RMSNorm (docs/method.md, section 4).
"""

from __future__ import annotations

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm, second_moment

__all__ = ["SeeDNorm", "SeeDNormScheme"]


class SeeDNorm(nn.Module):
    """One SeeDNorm site: vectors ``beta`` (self-rescaling), ``alpha`` and ``weight`` (``gamma``), width ``d``.

    Args:
        dim: hidden size ``d``.
        eps: added to ``mean(x^2)`` inside the rsqrt (as RMSNorm).
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.beta = nn.Parameter(torch.empty(dim))
        self.alpha = nn.Parameter(torch.empty(dim))
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.beta)
        nn.init.ones_(self.alpha)
        nn.init.ones_(self.weight)

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """The tanh argument ``x . beta``, one per token: [..., 1], float32 or wider."""
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return (xf * self.beta).sum(dim=-1, keepdim=True)

    def scalars(self) -> dict[str, torch.Tensor]:
        """No one-element parameters (``beta``, ``alpha`` and ``gamma`` are vectors)."""
        return {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        gain = torch.tanh(self.preactivation(x)) * self.alpha + self.weight  # [..., d]
        return (gain * xf * torch.rsqrt(second_moment(x) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


@register_norm("seednorm")
class SeeDNormScheme(NormScheme):
    """SeeDNorm at both sites of every block and as the final norm (Pre-LN placement).

    Args:
        eps: epsilon inside ``RMS(x) = sqrt(mean(x^2) + eps)``.
    """

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=SeeDNorm(dim, self.eps), mlp_in=SeeDNorm(dim, self.eps))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return SeeDNorm(dim, self.eps)

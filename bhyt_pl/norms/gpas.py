"""GPAS, Gradient-Preserving Activation Scaling (arXiv 2506.22049): Pre-LN whose residual stream is scaled
down after each add in the forward pass only, ``z -> z - SiLU(g) * stopgrad(z)``, so activations stop
growing with depth while the gradient through the stream is left whole (docs/method.md, the newer
schemes). One learnable gate ``g`` per layer, init 0, shared by the layer's two adds."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["GPASBlockNorms", "GPASScheme"]


class GPASBlockNorms(BlockNorms):
    """Pre-LN RMSNorm sites plus the gate ``gpas_gate`` [1] applied after both residual adds."""

    def __init__(self, attn_in: nn.Module, mlp_in: nn.Module) -> None:
        super().__init__(attn_in=attn_in, mlp_in=mlp_in)
        self.gpas_gate = nn.Parameter(torch.zeros(1))

    def _scale(self, z: torch.Tensor) -> torch.Tensor:
        # the forward value shrinks by SiLU(g); the detached copy keeps dL/dz the identity
        return z - F.silu(self.gpas_gate).to(z.dtype) * z.detach()

    def attn_residual(self, h: torch.Tensor) -> torch.Tensor:
        return self._scale(h)

    def mlp_residual(self, y: torch.Tensor) -> torch.Tensor:
        return self._scale(y)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.gpas_gate)


@register_norm("gpas")
class GPASScheme(NormScheme):
    """Pre-LN RMSNorm with a GPAS gate after each residual add, RMSNorm final norm.

    Args:
        eps: RMSNorm epsilon (the paper's code uses 1e-6).
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return GPASBlockNorms(attn_in=RMSNorm(dim, self.eps), mlp_in=RMSNorm(dim, self.eps))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

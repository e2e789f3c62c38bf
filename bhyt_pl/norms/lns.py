"""LayerNorm Scaling ("The Curse of Depth", arXiv 2502.05795).

Each pre-norm output of layer ``l`` (1-based), gain included, is multiplied by ``1/sqrt(l)`` at both
sites; the final norm is not scaled; no new parameters (docs/method.md, section 4).
"""

from __future__ import annotations

import math

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.layernorm import LayerNorm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["LNSScheme"]

_BASES = ("rmsnorm", "layernorm")


@register_norm("lns")
class LNSScheme(NormScheme):
    """LayerNorm Scaling on top of a Pre-LN base norm.

    Args:
        base: the norm that is scaled: ``rmsnorm`` (Llama's, default) or ``layernorm``.
        eps: epsilon of the base norm.
    """

    def __init__(self, base: str = "rmsnorm", eps: float = 1e-5) -> None:
        self.base, self.eps = base, eps
        problems = []
        if base not in _BASES:
            problems.append(f"base must be one of {', '.join(_BASES)}; got {base!r}")
        if eps <= 0:
            problems.append(f"eps must be > 0, got {eps}")
        self._raise_if(problems)

    def _norm(self, dim: int, scale: float = 1.0) -> nn.Module:
        return RMSNorm(dim, self.eps, scale) if self.base == "rmsnorm" else LayerNorm(dim, self.eps, scale=scale)

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        scale = 1.0 / math.sqrt(layer_idx + 1)  # l is 1-based
        return BlockNorms(attn_in=self._norm(dim, scale), mlp_in=self._norm(dim, scale))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return self._norm(dim)

"""Mix-LN (arXiv 2412.13795): Post-LN in the first ``floor(alpha * L)`` layers, Pre-LN after them.

Post-LN at the bottom keeps gradients large in the early layers and Pre-LN at the top keeps the deep
layers trainable; the final norm is the usual RMSNorm (docs/method.md, section 4).
"""

from __future__ import annotations

import math

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.post_ln import post_ln_block_norms
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["MixLNScheme"]


@register_norm("mix_ln")
class MixLNScheme(NormScheme):
    """Post-LN in the first ``floor(alpha * L)`` layers, Pre-LN (RMSNorm) in the rest, RMSNorm final norm.

    Args:
        alpha: fraction of the layers, from the bottom, that use Post-LN (the paper's 0.25).
        eps: RMSNorm epsilon.
    """

    def __init__(self, alpha: float = 0.25, eps: float = 1e-5) -> None:
        self.alpha, self.eps = alpha, eps
        problems = []
        if not 0.0 <= alpha <= 1.0:
            problems.append(f"alpha must be in [0, 1], got {alpha}")
        if not eps > 0:
            problems.append(f"eps must be > 0, got {eps}")
        self._raise_if(problems)

    def post_ln_layers(self, n_layers: int) -> int:
        """How many layers, from the bottom, use Post-LN: ``floor(alpha * L)``."""
        return math.floor(self.alpha * n_layers + 1e-9)  # 1e-9: 0.29 * 100 is 28.999999999999996 in floats

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        if layer_idx < self.post_ln_layers(n_layers):
            return post_ln_block_norms(dim, self.eps)
        return BlockNorms(attn_in=RMSNorm(dim, self.eps), mlp_in=RMSNorm(dim, self.eps))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

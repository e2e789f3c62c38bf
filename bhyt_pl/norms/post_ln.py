"""Post-LN, the original Transformer placement, with RMSNorm.

Post-LN normalises the residual stream after each add, ``h = Norm(x + Attn(x))``,
``y = Norm(h + MLP(h))``, through the ``attn_res``/``mlp_res`` sites of ``BlockNorms``; there is no
pre-norm and no extra final norm: the last block already ends in a norm (docs/method.md, the newer
schemes).
"""

from __future__ import annotations

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["PostLNScheme", "post_ln_block_norms"]


def post_ln_block_norms(dim: int, eps: float) -> BlockNorms:
    """A Post-LN block: identities before the sublayers, an RMSNorm after each residual add."""
    return BlockNorms(
        attn_in=nn.Identity(), mlp_in=nn.Identity(), attn_res=RMSNorm(dim, eps), mlp_res=RMSNorm(dim, eps)
    )


@register_norm("post_ln")
class PostLNScheme(NormScheme):
    """RMSNorm after both residual adds of every block; no pre-norm, no final norm.

    Args:
        eps: RMSNorm epsilon.
    """

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return post_ln_block_norms(dim, self.eps)

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return nn.Identity()  # the last block's output is already normalised

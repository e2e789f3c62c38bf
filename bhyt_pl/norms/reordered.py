"""OLMo 2's reordered norm (arXiv 2501.00656): each sublayer's output is normalised before the add,
``h = x + N(Attn(x))``, ``y = h + N(MLP(h))``, with no input norms and a final RMSNorm
(docs/method.md, the newer schemes). OLMo 2 pairs it with full-width QK-norm (``qk_norm: full``,
``recipes/norms/olmo2.yaml``)."""

from __future__ import annotations

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["ReorderedNormScheme"]


@register_norm("reordered")
class ReorderedNormScheme(NormScheme):
    """An RMSNorm on the output of each sublayer (``attn_out``, ``mlp_out``), none on its input.

    Args:
        eps: RMSNorm epsilon (OLMo 2 uses 1e-6).
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(
            attn_in=nn.Identity(), mlp_in=nn.Identity(), attn_out=RMSNorm(dim, self.eps), mlp_out=RMSNorm(dim, self.eps)
        )

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

"""HybridNorm (arXiv 2503.04598): QKV-norm inside attention and Post-LN around the MLP.

Attention gets no input norm; its queries, keys and values are each RMS-normalised per head (one gain
``[hd]`` shared by the heads) after the head split and before RoPE. The stream after the attention add is
normalised and carried on, ``h = N(x + Attn(x))``, ``y = h + MLP(h)``, so the MLP reads the normalised
stream without a norm of its own. HybridNorm* (``star``) makes block 0 a Pre-LN block that keeps the
QKV-norm (docs/method.md, the newer schemes).
"""

from __future__ import annotations

from torch import nn

from bhyt_pl.norms.base import AttentionNorms, BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["HybridNormScheme"]


@register_norm("hybridnorm")
class HybridNormScheme(NormScheme):
    """Per-head q, k and v RMSNorms, an RMSNorm after the attention add, a final RMSNorm.

    Args:
        eps: epsilon of every RMSNorm (the paper's 1e-5).
        star: HybridNorm*: block 0 is Pre-LN (``attn_in`` and ``mlp_in``, no ``attn_res``), keeping the QKV-norm.
    """

    owns_attention_norms = True

    def __init__(self, eps: float = 1e-5, star: bool = False) -> None:
        self.eps, self.star = eps, star
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        if self.star and layer_idx == 0:
            return BlockNorms(attn_in=RMSNorm(dim, self.eps), mlp_in=RMSNorm(dim, self.eps))
        return BlockNorms(attn_in=nn.Identity(), mlp_in=nn.Identity(), attn_res=RMSNorm(dim, self.eps))

    def attention_norms(
        self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, qk_norm: str | None, qk_norm_eps: float
    ) -> AttentionNorms:
        q, k, v = (RMSNorm(head_dim, self.eps) for _ in range(3))
        return AttentionNorms(q, k, v, layout="head")

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

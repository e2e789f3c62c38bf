"""Peri-LN (arXiv 2502.02732): ``x + Norm_out(Module(Norm_in(x)))`` for both sublayers (docs/method.md, section 4)."""

from __future__ import annotations

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import RMSNorm

__all__ = ["PeriLNScheme"]


@register_norm("peri_ln")
class PeriLNScheme(NormScheme):
    """Four RMSNorms a block (input and output of each sublayer), the final norm kept.

    Args:
        eps: RMSNorm epsilon.
        embed_norm: also normalise the token embeddings with an RMSNorm (off by default).
    """

    def __init__(self, eps: float = 1e-5, embed_norm: bool = False) -> None:
        self.eps, self.embed_norm = eps, embed_norm
        self._raise_if([] if eps > 0 else [f"eps must be > 0, got {eps}"])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        # output norms sit before the residual add; their gamma starts at 1 (RMSNorm's init)
        return BlockNorms(
            attn_in=RMSNorm(dim, self.eps),
            attn_out=RMSNorm(dim, self.eps),
            mlp_in=RMSNorm(dim, self.eps),
            mlp_out=RMSNorm(dim, self.eps),
        )

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps)

    def embedding_norm(self, dim: int) -> nn.Module:
        return RMSNorm(dim, self.eps) if self.embed_norm else nn.Identity()

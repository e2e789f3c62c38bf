"""The ``rmsnorm`` scheme: Pre-LN Llama, RMSNorm at both sites of every block and after the last one.

The site itself (``RMSNorm``, its fused autograd Function and ``IMPLS``) lives in ``bhyt_pl.norms.rms``, below
``bhyt_pl.norms.base``, whose default final norm it is; it is re-exported here.
"""

from __future__ import annotations

from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rms import IMPLS, RMSNorm, RMSNormFunction

__all__ = ["IMPLS", "RMSNorm", "RMSNormFunction", "RMSNormScheme"]


@register_norm("rmsnorm")
class RMSNormScheme(NormScheme):
    """Pre-LN with RMSNorm at both sites of every block and after the last block (docs/method.md, section 4).

    Args:
        eps: RMSNorm epsilon (Llama-3.2 uses 1e-5).
        impl: ``auto`` (default), ``reference`` or ``fused``: how each RMSNorm computes (same function).
    """

    def __init__(self, eps: float = 1e-5, impl: str = "auto") -> None:
        self.eps, self.impl = eps, impl
        problems = [] if eps > 0 else [f"eps must be > 0, got {eps}"]
        if impl not in IMPLS:
            problems.append(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        self._raise_if(problems)

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=RMSNorm(dim, self.eps, impl=self.impl), mlp_in=RMSNorm(dim, self.eps, impl=self.impl))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return RMSNorm(dim, self.eps, impl=self.impl)

"""Dynamic erf (Derf, arXiv 2512.10938): ``gamma * erf(alpha * x + s) (+ beta)``.

DyT with the Gaussian error function and a learnable scalar shift ``s`` inside it: one learnable
``alpha`` and ``s`` per site, separate alpha inits for the attention site, the MLP site and the final
norm, and DyT-LLaMA's learnable ``sqrt(d)`` embedding scale (docs/method.md, section 4).
The released code (zlab-princeton/Derf) always learns the bias ``beta``; so does ``bias=True`` here.
"""

from __future__ import annotations

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.dyt import EmbeddingScale

__all__ = ["Derf", "DerfScheme"]


class Derf(nn.Module):
    """One Derf site: learnable scalars ``alpha`` and ``shift``, a per-channel gain and an optional bias."""

    def __init__(self, dim: int, alpha_init: float, shift_init: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.dim, self.alpha_init, self.shift_init = dim, alpha_init, shift_init
        self.alpha = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        self.shift = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.constant_(self.shift, self.shift_init)
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """The erf argument ``alpha * x + s`` (float32 or wider)."""
        return self.alpha * x.to(torch.promote_types(x.dtype, torch.float32)) + self.shift

    def scalars(self) -> dict[str, torch.Tensor]:
        """``{"alpha": alpha, "shift": s}`` for diagnostics (the ``BoundedSite`` interface)."""
        return {"alpha": self.alpha, "shift": self.shift}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.erf(self.preactivation(x))
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha_init={self.alpha_init}, shift_init={self.shift_init}, bias={self.bias is not None}"


@register_norm("derf")
class DerfScheme(NormScheme):
    """Derf at both sites and as the final norm.

    Args:
        alpha_attn: initial alpha of the site before attention.
        alpha_mlp: initial alpha of the site before the MLP.
        alpha_final: initial alpha of the final norm.
        shift_init: initial shift ``s`` of every site (the paper's 0).
        bias: learn a per-channel bias (beta), as the released code does.
        embedding_scale: multiply embeddings by a learnable scalar initialised to sqrt(d) (DyT-LLaMA's);
            without it early activations are too small to train.
    """

    def __init__(
        self,
        alpha_attn: float = 0.5,
        alpha_mlp: float = 0.5,
        alpha_final: float = 0.5,
        shift_init: float = 0.0,
        bias: bool = True,
        embedding_scale: bool = True,
    ) -> None:
        self.alpha_attn, self.alpha_mlp, self.alpha_final = alpha_attn, alpha_mlp, alpha_final
        self.shift_init, self.bias, self.embedding_scale = shift_init, bias, embedding_scale
        self._raise_if(
            [
                f"{n} must be > 0, got {v}"
                for n, v in (("alpha_attn", alpha_attn), ("alpha_mlp", alpha_mlp), ("alpha_final", alpha_final))
                if not v > 0
            ]
        )

    def _site(self, dim: int, alpha: float) -> Derf:
        return Derf(dim, alpha, self.shift_init, self.bias)

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return BlockNorms(attn_in=self._site(dim, self.alpha_attn), mlp_in=self._site(dim, self.alpha_mlp))

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return self._site(dim, self.alpha_final)

    def embedding_norm(self, dim: int) -> nn.Module:
        return EmbeddingScale(dim) if self.embedding_scale else nn.Identity()

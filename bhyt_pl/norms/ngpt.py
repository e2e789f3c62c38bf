"""nGPT, the normalized Transformer (arXiv 2410.01131), as OLMo-core's ``NormalizedTransformer``.

Every vector that meets the residual stream lives on the unit sphere: the stream itself, each weight matrix
along the model width (rows of q, k, v, gate, up, the embedding and the output head; columns of the
attention output and of down), and the normalised sublayer outputs. A block moves the stream towards the
normalised sublayer output by a learned per-channel step and renormalises::

    h = L2(x + a_A * (L2(Attn(x)) - x)),   y = L2(h + a_M * (L2(MLP(h)) - h))

with ``a = |alpha * 0.05 * sqrt(d)|``. Queries and keys are L2-normalised over the whole projection and
scaled by ``s_q``, ``s_k`` (effective ``s * sqrt(d)``), the softmax scale is ``sqrt(hd)``, the SwiGLU's
inputs are scaled (``s_up``; ``s_gate * sqrt(d)``) and the logits by ``s_z * sqrt(d)``. No norm layers, no
final norm; the weights are renormalised after every optimizer step (``constrain_weights``). OLMo-core
trains it with Adam without weight decay and without warmup (docs/method.md, the newer schemes).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from bhyt_pl.norms.base import AttentionNorms, BlockNorms, MLPScales, NormScheme, Scale, register_norm

__all__ = ["L2Norm", "NGPTBlockNorms", "NGPTScheme", "l2_normalize", "unit_norm_tolerance"]

ALPHA_INIT_VALUE = 0.05
"""OLMo-core's ``attn_alpha_init_value``: the effective step ``|alpha| * 0.05 * sqrt(d)`` starts at 0.05."""


def unit_norm_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 the norm of an already normalised row of ``dtype`` can be, from rounding alone: 8 machine
    epsilons of the dtype (bfloat16: 0.06; the rounding of each element) plus 1e-5 (the float32 sum over a long
    row: measured at most 3.5 float32 epsilons, 4e-7, at d = 8192). Loading leaves such rows as they are."""
    return 8 * torch.finfo(dtype).eps + 1e-5


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x / ||x||`` along ``dim``, the norm in at least float32 (OLMo-core's ``l2_normalize``; no epsilon).
    Works on FSDP2 ``DTensor`` shards: a norm over a sharded dimension is reduced across ranks."""
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32))
    return x / norm.type_as(x)


class L2Norm(nn.Module):
    """``L2(x)`` over the last dimension, no parameters (nGPT's query and key norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x)


class NGPTBlockNorms(BlockNorms):
    """No norm sites; the residual updates move the stream on the sphere with eigen learning rates
    ``alpha_attn``, ``alpha_mlp`` [d] (init ``1/sqrt(d)``, effective ``|alpha| * 0.05 * sqrt(d)``)."""

    def __init__(self, dim: int) -> None:
        super().__init__(attn_in=nn.Identity(), mlp_in=nn.Identity())
        self.dim = dim
        self.alpha_attn = nn.Parameter(torch.empty(dim))
        self.alpha_mlp = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def _step(self, x: torch.Tensor, branch: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        a = (alpha * (ALPHA_INIT_VALUE * math.sqrt(self.dim))).abs().to(x.dtype)
        # lerp: x + a * (L2(f) - x). lerp does not promote, and under bf16 autocast the stream x stays float32
        # while the sublayer output f is bfloat16, so f is cast to the stream's dtype first
        return l2_normalize(torch.lerp(x, l2_normalize(branch).to(x.dtype), a))

    def attn_update(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self._step(x, a, self.alpha_attn)

    def mlp_update(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return self._step(h, m, self.alpha_mlp)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.constant_(self.alpha_attn, 1.0 / math.sqrt(self.dim))
        nn.init.constant_(self.alpha_mlp, 1.0 / math.sqrt(self.dim))


@register_norm("ngpt")
class NGPTScheme(NormScheme):
    """nGPT: hypersphere residual updates, L2 q/k norms with scales, scaled SwiGLU inputs and logits, weights
    renormalised along the model width after every step. Untied embeddings; no arguments (OLMo-core's)."""

    owns_attention_norms = True
    model_settings: ClassVar[dict[str, Any]] = {"tie_embeddings": False}
    training_defaults: ClassVar[dict[str, Any]] = {"weight_decay": 0.0, "warmup_steps": 0}

    def __init__(self) -> None:
        self._raise_if([])

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        return NGPTBlockNorms(dim)

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        return nn.Identity()  # the stream is already on the unit sphere

    def attention_norms(
        self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, qk_norm: str | None, qk_norm_eps: float
    ) -> AttentionNorms:
        d = dim
        return AttentionNorms(
            L2Norm(),
            L2Norm(),
            nn.Identity(),
            layout="full",
            softmax_scale=math.sqrt(head_dim),
            q_scale=Scale("sq", n_heads * head_dim, 1.0 / math.sqrt(d), math.sqrt(d)),
            k_scale=Scale("sk", n_kv_heads * head_dim, 1.0 / math.sqrt(d), math.sqrt(d)),
        )

    def mlp_scales(self, dim: int, mlp_dim: int) -> MLPScales:
        return MLPScales(up=Scale("s_up", mlp_dim, 1.0), gate=Scale("s_gate", mlp_dim, 1.0, math.sqrt(dim)))

    def logit_scale(self, dim: int, vocab_size: int) -> Scale | None:
        return Scale("s_z", vocab_size, 1.0 / math.sqrt(dim), math.sqrt(dim))

    def constrain_weights(self, matrices: list[tuple[torch.Tensor, int]], *, keep_satisfied: bool = False) -> None:
        """Every row (``dim=-1``) or column (``dim=0``) to unit L2 norm. Renormalising a row that is already
        unit still moves about 40% of its elements by an ulp, so with ``keep_satisfied`` (after loading) only
        rows whose norm differs from 1 by more than ``unit_norm_tolerance`` are renormalised; the others keep
        their loaded bits."""
        for weight, dim in matrices:
            if not keep_satisfied:
                weight.copy_(l2_normalize(weight, dim=dim))
                continue
            norm = torch.linalg.vector_norm(
                weight, dim=dim, keepdim=True, dtype=torch.promote_types(weight.dtype, torch.float32)
            )
            off = (norm - 1).abs() > unit_norm_tolerance(weight.dtype)
            weight.copy_(torch.where(off, weight / norm.type_as(weight), weight))

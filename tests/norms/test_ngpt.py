"""``ngpt``: nGPT (arXiv 2410.01131) as OLMo-core's ``NormalizedTransformer``; its float64 reference for the
shared per-scheme checks."""

from __future__ import annotations

import math

import torch
from reference_model import SchemeReference, _p, causal_softmax_attention, rope_ref


def l2(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True)


def ngpt_attention_ref(u: torch.Tensor, attn, config, args) -> torch.Tensor:
    """nGPT attention: q, k L2-normalised over the whole projection, times ``s * sqrt(d)``, then split and
    rotated; softmax scale ``sqrt(hd)``."""
    W = lambda lin: lin.weight.detach().double()  # noqa: E731
    B, T, d = u.shape
    H, K, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    q = l2(u @ W(attn.q_proj).T) * _p(attn.sq) * math.sqrt(d)
    k = l2(u @ W(attn.k_proj).T) * _p(attn.sk) * math.sqrt(d)
    v = u @ W(attn.v_proj).T
    q, k = q.view(B, T, H, hd).transpose(1, 2), k.view(B, T, K, hd).transpose(1, 2)
    v = v.view(B, T, K, hd).transpose(1, 2)
    q, k = rope_ref(q, config.rope_theta), rope_ref(k, config.rope_theta)
    return causal_softmax_attention(q, k, v, attn, math.sqrt(hd))


def ngpt_mlp_ref(h: torch.Tensor, mlp) -> torch.Tensor:
    """``down((up(h) * s_up) * silu(gate(h) * s_gate * sqrt(d)))``."""
    W = lambda lin: lin.weight.detach().double()  # noqa: E731
    d = h.shape[-1]
    g = (h @ W(mlp.gate_proj).T) * _p(mlp.s_gate) * math.sqrt(d)
    return ((h @ W(mlp.up_proj).T) * _p(mlp.s_up) * (g * torch.sigmoid(g))) @ W(mlp.down_proj).T


def _block(x, layer, li, model, args, attend):
    """``h = L2(x + a_A (L2(Attn(x)) - x))``, ``y = L2(h + a_M (L2(MLP(h)) - h))``, ``a = |alpha * 0.05 * sqrt(d)|``."""
    n, d = layer.norms, x.shape[-1]
    a_attn = (_p(n.alpha_attn) * 0.05 * math.sqrt(d)).abs()
    a_mlp = (_p(n.alpha_mlp) * 0.05 * math.sqrt(d)).abs()
    h = l2(x + a_attn * (l2(attend(x, layer.attn)) - x))
    return l2(h + a_mlp * (l2(ngpt_mlp_ref(h, layer.mlp)) - h))


REFERENCES = {
    "ngpt": SchemeReference(
        block=_block,
        attention=ngpt_attention_ref,
        final=lambda x, f, args: x,  # no final norm: the last block ends on the unit sphere
        logits=lambda logits, model: logits * _p(model.s_z) * math.sqrt(model.config.dim),  # times s_z * sqrt(d)
    ),
}

"""Independent float64 reference of the model, written from the formulas of docs/method.md (sections 2-5).

Reads only weights from the package's modules; none of the package's norm, attention or RoPE code runs
here. The model around the norms (embedding, attention, MLP, head) is written once, in ``model_ref``; what a
norm scheme does is its ``SchemeReference``, which lives in the scheme's own test file
(``tests/norms/test_<module>.py`` for ``bhyt_pl/norms/<module>.py``, as ``REFERENCES[name]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


def rope_ref(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, h, T, hd]: rotate each pair (i, i + hd/2) by angle pos * theta^(-2i/hd)."""
    B, h, T, hd = x.shape
    half = hd // 2
    out = x.clone()
    for i in range(half):
        freq = theta ** (-2.0 * i / hd)
        ang = torch.arange(T, dtype=torch.float64) * freq
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * c - b * s
        out[..., i + half] = b * c + a * s
    return out


def attention_ref(
    u: torch.Tensor, attn, theta: float, qk_norm_eps: float | None = None, layout: str = "head", v_norm_eps=None
) -> torch.Tensor:
    """Causal GQA attention. With ``qk_norm_eps`` queries and keys are RMS-normalised before RoPE (gains
    ``attn.q_norm.weight``/``attn.k_norm.weight``): each head vector over hd (``layout="head"``) or the whole
    projection before the head split (``"full"``); with ``v_norm_eps`` each value head too (HybridNorm)."""
    W = lambda lin: lin.weight.detach().double()  # noqa: E731
    B, T, d = u.shape
    H, K, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    q, k, v = u @ W(attn.q_proj).T, u @ W(attn.k_proj).T, u @ W(attn.v_proj).T  # [B, T, H*hd], [B, T, K*hd] x2
    if qk_norm_eps is not None and layout == "full":
        q, k = rms(q, attn.q_norm.weight, qk_norm_eps), rms(k, attn.k_norm.weight, qk_norm_eps)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, K, hd).transpose(1, 2)
    v = v.view(B, T, K, hd).transpose(1, 2)
    if qk_norm_eps is not None and layout == "head":
        q, k = rms(q, attn.q_norm.weight, qk_norm_eps), rms(k, attn.k_norm.weight, qk_norm_eps)
    if v_norm_eps is not None:
        v = rms(v, attn.v_norm.weight, v_norm_eps)
    q, k = rope_ref(q, theta), rope_ref(k, theta)
    return causal_softmax_attention(q, k, v, attn, 1 / math.sqrt(hd))


def causal_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale, causal) v`` with each KV head repeated over its query group, then ``W_O``:
    q [B, H, T, hd], k and v [B, K, T, hd] -> [B, T, d]."""
    B, H, T, hd = q.shape
    group = H // k.shape[1]
    k = torch.stack([k[:, h // group] for h in range(H)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(H)], dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, hd]
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.o_proj.weight.detach().double().T


def mlp_ref(v: torch.Tensor, mlp) -> torch.Tensor:
    W = lambda lin: lin.weight.detach().double()  # noqa: E731
    g = v @ W(mlp.gate_proj).T
    return ((g * torch.sigmoid(g)) * (v @ W(mlp.up_proj).T)) @ W(mlp.down_proj).T


def vo_constant_ref(attn, seq_len: int) -> float:
    """||W_V W_O||_F^2 / (T d) from the dense product, the GQA expansion written out head by head."""
    wv = attn.v_proj.weight.detach().double()  # [K*hd, d]
    wo = attn.o_proj.weight.detach().double()  # [d, H*hd]
    H, K, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    d = wv.shape[1]
    product = torch.zeros(d, d, dtype=torch.float64)
    for h in range(H):
        kv = h // (H // K)
        product += wo[:, h * hd : (h + 1) * hd] @ wv[kv * hd : (kv + 1) * hd]
    return float(product.pow(2).sum() / (seq_len * d))


def _p(t) -> torch.Tensor:
    return t.detach().double()


def rms(x, g, eps):
    return _p(g) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def layernorm(x, g, eps):
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return _p(g) * (x - mu) / torch.sqrt(var + eps)


def pre_ln_block(x: torch.Tensor, layer, norm: Callable, attend: Callable) -> torch.Tensor:
    """``h = x + Attn(N(x))``, ``y = h + MLP(N(h))`` with ``norm(z, site)`` at ``attn_in`` and ``mlp_in``."""
    n = layer.norms
    h = x + attend(norm(x, n.attn_in), layer.attn)
    return h + mlp_ref(norm(h, n.mlp_in), layer.mlp)


def post_ln_block(x: torch.Tensor, layer, eps: float, attend: Callable) -> torch.Tensor:
    """Post-LN: ``h = N(x + Attn(x))``, ``y = N(h + MLP(h))`` with RMSNorms at ``attn_res`` and ``mlp_res``."""
    n = layer.norms
    h = rms(x + attend(x, layer.attn), n.attn_res.weight, eps)
    return rms(h + mlp_ref(h, layer.mlp), n.mlp_res.weight, eps)


def scaled_embedding(x: torch.Tensor, model, args: Mapping[str, Any]) -> torch.Tensor:
    """The learnable embedding scale of DyT-like schemes (``embedding_scale=True``, init ``sqrt(d)``)."""
    return x * _p(model.emb_norm.scale) if args.get("embedding_scale", True) else x


Attend = Callable[[torch.Tensor, Any], torch.Tensor]
"""``attend(u, attn) -> [B, T, d]``: the block's attention on its (normalised) input."""


@dataclass(frozen=True)
class Case:
    """A configuration a scheme's reference is checked at, besides its defaults."""

    args: dict[str, Any] = field(default_factory=dict)
    """The scheme's constructor arguments (``norm_args``)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Model options (``LlamaConfig`` fields, e.g. ``{"qk_norm": "head"}``)."""


@dataclass(frozen=True)
class SchemeReference:
    """What one norm scheme does to the model, in float64 from docs/method.md; the rest is ``model_ref``'s.

    ``block(x, layer, layer_idx, model, args, attend)`` is required; the others default to a plain Llama:
    the embedding unscaled, attention as ``LlamaConfig.qk_norm`` says, an RMSNorm final norm (eps 1e-5),
    logits unscaled.
    """

    block: Callable[..., torch.Tensor]
    final: Callable[[torch.Tensor, Any, Mapping[str, Any]], torch.Tensor] = lambda x, f, args: rms(x, f.weight, 1e-5)
    embed: Callable[[torch.Tensor, Any, Mapping[str, Any]], torch.Tensor] = lambda x, model, args: x
    attention: Callable[..., torch.Tensor] | None = None
    """``attention(u, attn, config, args)``; None: ``attention_ref`` with the config's QK-norm."""
    logits: Callable[[torch.Tensor, Any], torch.Tensor] = lambda logits, model: logits
    cases: tuple[Case, ...] = ()
    """Arguments and model options the reference is also checked at (every scheme is checked at its defaults)."""


def model_ref(model, idx: torch.Tensor, reference: SchemeReference, args: Mapping[str, Any]) -> torch.Tensor:
    """Logits of ``model`` for ``idx`` in float64: embedding, blocks, final norm and head written out here,
    every norm from the scheme's ``reference``."""
    cfg = model.config
    if reference.attention is not None:
        attend: Attend = lambda u, attn: reference.attention(u, attn, cfg, args)  # noqa: E731
    else:
        qk_eps = cfg.qk_norm_eps if cfg.qk_norm else None
        layout = "full" if cfg.qk_norm == "full" else "head"
        attend = lambda u, attn: attention_ref(u, attn, cfg.rope_theta, qk_eps, layout)  # noqa: E731
    x = reference.embed(_p(model.embed.weight)[idx], model, args)
    for li, layer in enumerate(model.layers):
        x = reference.block(x, layer, li, model, args, attend)
    x = reference.final(x, model.final_norm, args)
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    return reference.logits(x @ _p(head).T, model)

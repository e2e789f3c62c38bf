"""Independent float64 reference of the model, written from the formulas of docs/method.md (sections 2-5).

Reads only weights from the package's modules; none of the package's norm, attention or RoPE
code runs here.
"""

from __future__ import annotations

import math

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
    group = H // K
    k = torch.stack([k[:, h // group] for h in range(H)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(H)], dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, H, T, hd]
    return y.transpose(1, 2).reshape(B, T, H * hd) @ W(attn.o_proj).T


def l2(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True)


def ngpt_attention_ref(u: torch.Tensor, attn, theta: float) -> torch.Tensor:
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
    q, k = rope_ref(q, theta), rope_ref(k, theta)
    group = H // K
    k = torch.stack([k[:, h // group] for h in range(H)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(H)], dim=1)
    scores = q @ k.transpose(-1, -2) * math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, H * hd) @ W(attn.o_proj).T


def ngpt_mlp_ref(h: torch.Tensor, mlp) -> torch.Tensor:
    """``down((up(h) * s_up) * silu(gate(h) * s_gate * sqrt(d)))``."""
    W = lambda lin: lin.weight.detach().double()  # noqa: E731
    d = h.shape[-1]
    g = (h @ W(mlp.gate_proj).T) * _p(mlp.s_gate) * math.sqrt(d)
    return ((h @ W(mlp.up_proj).T) * _p(mlp.s_up) * (g * torch.sigmoid(g))) @ W(mlp.down_proj).T


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


def bhyt_site(x, site, kappa, eps, stat, spread=None, mean=None):
    """gamma * tanh(lambda * x / D); D from the given (approximated) statistic or exact ones."""
    if stat == "rms":
        m = x.pow(2).mean(-1, keepdim=True) if spread is None else spread
        denom = kappa * torch.sqrt(m + eps)
    else:
        mu = x.mean(-1, keepdim=True) if mean is None else mean
        var = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) if spread is None else spread
        denom = kappa * torch.sqrt(var + eps) + mu.abs()
    return _p(site.weight) * torch.tanh(_p(site.lambda_) * x / denom)


def derf_site(x, site):
    """Derf (arXiv 2512.10938): gamma * erf(alpha * x + s) + beta."""
    y = _p(site.weight) * torch.erf(_p(site.alpha) * x + _p(site.shift))
    return y + _p(site.bias) if site.bias is not None else y


def dyisru_site(x, site):
    """DyISRU: RMSNorm's coordinate x_i / sqrt((x_i^2 + C_i)/d) with C_i replaced by the scalar beta."""
    d = x.shape[-1]
    return _p(site.weight) * x / torch.sqrt((x.pow(2) + _p(site.beta)) / d)


def seednorm_site(x, site, eps):
    """SeeDNorm: [tanh(x . beta) * alpha + gamma] * x / sqrt(mean(x^2) + eps), x . beta one scalar per token."""
    s = torch.tanh((x * _p(site.beta)).sum(-1, keepdim=True))
    return (s * _p(site.alpha) + _p(site.weight)) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def model_ref(model, idx: torch.Tensor, norm: str, args: dict) -> torch.Tensor:
    """Logits of ``model`` for ``idx`` in float64, every norm from the formulas of docs/method.md."""
    cfg = model.config
    theta = cfg.rope_theta
    qk_eps = cfg.qk_norm_eps if cfg.qk_norm else None
    layout = "full" if cfg.qk_norm == "full" else "head"
    attend = lambda u, attn: attention_ref(u, attn, theta, qk_eps, layout)  # noqa: E731
    if norm == "hybridnorm":  # per-head q, k and v norms with the scheme's eps
        hn_eps = args.get("eps", 1e-5)
        attend = lambda u, attn: attention_ref(u, attn, theta, hn_eps, "head", v_norm_eps=hn_eps)  # noqa: E731
    x = _p(model.embed.weight)[idx]
    if norm in ("dyt", "derf", "dyisru") and args.get("embedding_scale", True):
        x = x * _p(model.emb_norm.scale)
    if norm == "peri_ln" and args.get("embed_norm", False):
        x = rms(x, model.emb_norm.weight, 1e-5)
    kappa = args.get("kappa") or 1.0 / math.sqrt(1.0 - args.get("p", 0.99))
    eps_b, stat = args.get("eps", 1e-6), args.get("stat", "rms")
    for li, layer in enumerate(model.layers):
        n, attn, mlp = layer.norms, layer.attn, layer.mlp
        if norm in ("rmsnorm", "lns", "peri_ln"):
            scale = 1.0 / math.sqrt(li + 1) if norm == "lns" else 1.0
            u = rms(x, n.attn_in.weight, 1e-5) * scale
            a = attend(u, attn)
            a = rms(a, n.attn_out.weight, 1e-5) if norm == "peri_ln" else a
            h = x + a
            v = rms(h, n.mlp_in.weight, 1e-5) * scale
            o = mlp_ref(v, mlp)
            o = rms(o, n.mlp_out.weight, 1e-5) if norm == "peri_ln" else o
            x = h + o
        elif norm == "layernorm":
            h = x + attend(layernorm(x, n.attn_in.weight, 1e-5), attn)
            x = h + mlp_ref(layernorm(h, n.mlp_in.weight, 1e-5), mlp)
        elif norm == "dyt":
            dyt = lambda z, s: _p(s.weight) * torch.tanh(_p(s.alpha) * z)  # noqa: E731
            h = x + attend(dyt(x, n.attn_in), attn)
            x = h + mlp_ref(dyt(h, n.mlp_in), mlp)
        elif norm in ("bhyt", "bhyt_exact"):
            u = bhyt_site(x, n.attn_in, kappa, eps_b, stat)
            h = x + attend(u, attn)
            exact_layers = args.get("exact_layers")
            if isinstance(exact_layers, int):
                exact_here = li < exact_layers  # the first k layers
            else:
                exact_here = li in (exact_layers or ())
            if norm == "bhyt" and not exact_here:
                lam_a = float(n.attn_in.lambda_.detach())
                corr = vo_constant_ref(attn, args.get("seq_len", 1024)) * lam_a**2 / kappa**2
                if stat == "rms":
                    spread, mean = x.pow(2).mean(-1, keepdim=True) + corr, None
                else:
                    mean = x.mean(-1, keepdim=True)
                    spread = (x - mean).pow(2).mean(-1, keepdim=True) + corr
                v = bhyt_site(h, n.mlp_in, kappa, eps_b, stat, spread=spread, mean=mean)
            else:
                v = bhyt_site(h, n.mlp_in, kappa, eps_b, stat)
            x = h + mlp_ref(v, mlp)
        elif norm in ("derf", "dyisru", "seednorm"):
            site = {
                "derf": derf_site,
                "dyisru": dyisru_site,
                "seednorm": lambda z, s: seednorm_site(z, s, args.get("eps", 1e-5)),
            }[norm]
            h = x + attend(site(x, n.attn_in), attn)
            x = h + mlp_ref(site(h, n.mlp_in), mlp)
        elif norm in ("post_ln", "mix_ln"):
            eps = args.get("eps", 1e-5)
            n_layers = len(model.layers)
            n_post = n_layers if norm == "post_ln" else math.floor(args.get("alpha", 0.25) * n_layers)
            if li < n_post:  # Post-LN: y = Norm(x + F(x)) after each residual add
                h = rms(x + attend(x, attn), n.attn_res.weight, eps)
                x = rms(h + mlp_ref(h, mlp), n.mlp_res.weight, eps)
            else:  # Pre-LN
                h = x + attend(rms(x, n.attn_in.weight, eps), attn)
                x = h + mlp_ref(rms(h, n.mlp_in.weight, eps), mlp)
        elif norm == "reordered":  # OLMo 2: h = x + N(Attn(x)), y = h + N(MLP(h))
            eps = args.get("eps", 1e-6)
            h = x + rms(attend(x, attn), n.attn_out.weight, eps)
            x = h + rms(mlp_ref(h, mlp), n.mlp_out.weight, eps)
        elif norm == "hybridnorm":
            eps = args.get("eps", 1e-5)
            if args.get("star", False) and li == 0:  # HybridNorm*: a Pre-LN first block
                h = x + attend(rms(x, n.attn_in.weight, eps), attn)
                x = h + mlp_ref(rms(h, n.mlp_in.weight, eps), mlp)
            else:  # h = x + Attn(x); y = N(h) + MLP(N(h))
                hn = rms(x + attend(x, attn), n.attn_res.weight, eps)
                x = hn + mlp_ref(hn, mlp)
        elif norm == "ssnorm":  # Pre-LN, one scalar gain per norm
            eps = args.get("eps", 1e-6)
            h = x + attend(rms(x, n.attn_in.weight, eps), attn)
            x = h + mlp_ref(rms(h, n.mlp_in.weight, eps), mlp)
        elif norm == "gpas":  # Pre-LN; after each add z - SiLU(g) z (stopgrad changes only the backward)
            eps = args.get("eps", 1e-6)
            g = _p(n.gpas_gate)
            shrink = g * torch.sigmoid(g)
            h = x + attend(rms(x, n.attn_in.weight, eps), attn)
            h = h - shrink * h
            x = h + mlp_ref(rms(h, n.mlp_in.weight, eps), mlp)
            x = x - shrink * x
        elif norm == "ngpt":  # h = L2(x + a_A (L2(Attn(x)) - x)), a = |alpha * 0.05 * sqrt(d)|
            d = x.shape[-1]
            a_attn = (_p(n.alpha_attn) * 0.05 * math.sqrt(d)).abs()
            a_mlp = (_p(n.alpha_mlp) * 0.05 * math.sqrt(d)).abs()
            h = l2(x + a_attn * (l2(ngpt_attention_ref(x, attn, theta)) - x))
            x = l2(h + a_mlp * (l2(ngpt_mlp_ref(h, mlp)) - h))
        else:
            raise ValueError(norm)
    f = model.final_norm
    if norm == "layernorm":
        x = layernorm(x, f.weight, 1e-5)
    elif norm in ("post_ln", "ngpt"):
        pass  # no final norm: the last block ends in one (nGPT: on the unit sphere)
    elif norm == "derf":
        x = derf_site(x, f)
    elif norm == "dyisru":
        x = dyisru_site(x, f)
    elif norm == "seednorm":
        x = seednorm_site(x, f, args.get("eps", 1e-5))
    elif norm == "dyt":
        x = _p(f.weight) * torch.tanh(_p(f.alpha) * x)
    elif norm in ("bhyt", "bhyt_exact") and args.get("lambda_final", 0) > 0:
        x = bhyt_site(x, f, kappa, eps_b, stat)
    elif norm in ("reordered", "ssnorm", "gpas"):
        x = rms(x, f.weight, args.get("eps", 1e-6))
    elif norm == "hybridnorm":
        x = rms(x, f.weight, args.get("eps", 1e-5))
    else:
        x = rms(x, f.weight, 1e-5)
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    logits = x @ _p(head).T
    if norm == "ngpt":  # times s_z * sqrt(d)
        logits = logits * _p(model.s_z) * math.sqrt(x.shape[-1])
    return logits

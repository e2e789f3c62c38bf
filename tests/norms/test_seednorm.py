"""``seednorm``: SeeDNorm (arXiv 2510.22777), ``[tanh(x . beta) * alpha + gamma] * x / RMS(x)``: its float64
reference for the shared per-scheme checks, and RMSNorm at init."""

from __future__ import annotations

import torch
from reference_model import Case, SchemeReference, _p, pre_ln_block

from bhyt_pl import Llama, LlamaConfig


def seednorm_site(x, site, eps):
    """x . beta is one scalar per token."""
    s = torch.tanh((x * _p(site.beta)).sum(-1, keepdim=True))
    return (s * _p(site.alpha) + _p(site.weight)) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


REFERENCES = {
    "seednorm": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(
            x, layer, lambda z, site: seednorm_site(z, site, args.get("eps", 1e-5)), attend
        ),
        final=lambda x, f, args: seednorm_site(x, f, args.get("eps", 1e-5)),
        cases=(Case({"eps": 1e-3}), Case(overrides={"qk_norm": "head"})),
    ),
}


def test_seednorm_equals_rmsnorm_at_init() -> None:
    kw = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48)
    torch.manual_seed(0)
    seed = Llama(LlamaConfig.from_name("tiny", norm="seednorm", **kw))
    torch.manual_seed(0)
    rms = Llama(LlamaConfig.from_name("tiny", norm="rmsnorm", **kw))
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(seed(idx), rms(idx))

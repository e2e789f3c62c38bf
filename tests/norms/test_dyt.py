"""``dyt``: Dynamic Tanh, ``gamma * tanh(alpha * x)``, with a learnable embedding scale; its float64 reference
for the shared per-scheme checks."""

from __future__ import annotations

import torch
from reference_model import Case, SchemeReference, _p, pre_ln_block, scaled_embedding


def dyt_site(x, site):
    return _p(site.weight) * torch.tanh(_p(site.alpha) * x)


REFERENCES = {
    "dyt": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(x, layer, dyt_site, attend),
        final=lambda x, f, args: dyt_site(x, f),
        embed=scaled_embedding,
        cases=(Case({"alpha_attn": 0.8, "alpha_mlp": 0.2, "alpha_final": 0.3}), Case({"embedding_scale": False})),
    ),
}

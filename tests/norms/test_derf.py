"""``derf``: Dynamic erf (arXiv 2512.10938), ``gamma * erf(alpha * x + s) + beta``; its float64 reference for
the shared per-scheme checks."""

from __future__ import annotations

import torch
from reference_model import Case, SchemeReference, _p, pre_ln_block, scaled_embedding


def derf_site(x, site):
    y = _p(site.weight) * torch.erf(_p(site.alpha) * x + _p(site.shift))
    return y + _p(site.bias) if site.bias is not None else y


REFERENCES = {
    "derf": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(x, layer, derf_site, attend),
        final=lambda x, f, args: derf_site(x, f),
        embed=scaled_embedding,
        cases=(
            Case({"alpha_attn": 0.8, "alpha_mlp": 0.2, "alpha_final": 0.3, "shift_init": 0.1, "bias": False}),
            Case(overrides={"qk_norm": "head"}),
        ),
    ),
}

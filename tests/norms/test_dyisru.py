"""``dyisru``: Dynamic ISRU (arXiv 2503.21708), RMSNorm with the other coordinates' squares replaced by one
learnable scalar; its float64 reference for the shared per-scheme checks."""

from __future__ import annotations

import torch
from reference_model import Case, SchemeReference, _p, pre_ln_block, scaled_embedding


def dyisru_site(x, site):
    """RMSNorm's coordinate x_i / sqrt((x_i^2 + C_i)/d) with C_i replaced by the scalar beta."""
    d = x.shape[-1]
    return _p(site.weight) * x / torch.sqrt((x.pow(2) + _p(site.beta)) / d)


REFERENCES = {
    "dyisru": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(x, layer, dyisru_site, attend),
        final=lambda x, f, args: dyisru_site(x, f),
        embed=scaled_embedding,
        cases=(Case({"beta_init": 8.0, "embedding_scale": False}),),
    ),
}

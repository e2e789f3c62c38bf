"""``layernorm``: Pre-LN LayerNorm; its float64 reference for the shared per-scheme checks."""

from __future__ import annotations

from reference_model import SchemeReference, layernorm, pre_ln_block

REFERENCES = {
    "layernorm": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(
            x, layer, lambda z, site: layernorm(z, site.weight, 1e-5), attend
        ),
        final=lambda x, f, args: layernorm(x, f.weight, 1e-5),
    ),
}

"""``post_ln``: RMSNorm after each residual add, no pre-norm and no final norm; its float64 reference for the
shared per-scheme checks."""

from __future__ import annotations

from reference_model import Case, SchemeReference, post_ln_block

REFERENCES = {
    "post_ln": SchemeReference(
        block=lambda x, layer, li, model, args, attend: post_ln_block(x, layer, args.get("eps", 1e-5), attend),
        final=lambda x, f, args: x,  # the last block ends in a norm
        cases=(Case(overrides={"qk_norm": "head"}),),
    ),
}

"""``ssnorm``: Pre-LN RMSNorm whose gain is one scalar (arXiv 2506.19697); its float64 reference for the shared
per-scheme checks."""

from __future__ import annotations

from reference_model import Case, SchemeReference, pre_ln_block, rms

REFERENCES = {
    "ssnorm": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(
            x, layer, lambda z, site: rms(z, site.weight, args.get("eps", 1e-6)), attend
        ),
        final=lambda x, f, args: rms(x, f.weight, args.get("eps", 1e-6)),
        cases=(Case({"eps": 1e-3}),),
    ),
}

"""``lns``: LayerNorm Scaling, each pre-norm output of layer ``l`` (1-based) times ``1/sqrt(l)``; its float64
reference for the shared per-scheme checks."""

from __future__ import annotations

import math

from reference_model import Case, SchemeReference, layernorm, pre_ln_block, rms


def _base(args: dict):
    return layernorm if args.get("base", "rmsnorm") == "layernorm" else rms


def _block(x, layer, li, model, args, attend):
    norm, eps, scale = _base(args), args.get("eps", 1e-5), 1.0 / math.sqrt(li + 1)
    return pre_ln_block(x, layer, lambda z, site: norm(z, site.weight, eps) * scale, attend)


REFERENCES = {
    "lns": SchemeReference(
        block=_block,
        final=lambda x, f, args: _base(args)(x, f.weight, args.get("eps", 1e-5)),  # the final norm is not scaled
        cases=(Case({"base": "layernorm"}),),
    ),
}

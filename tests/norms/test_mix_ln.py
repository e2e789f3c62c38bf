"""``mix_ln``: Post-LN in the first ``floor(alpha * L)`` layers, Pre-LN RMSNorm after (arXiv 2412.13795); its
float64 reference for the shared per-scheme checks (3 layers: the default alpha 0.25 gives no Post-LN layer,
0.5 gives one)."""

from __future__ import annotations

import math

from reference_model import Case, SchemeReference, post_ln_block, pre_ln_block, rms


def _block(x, layer, li, model, args, attend):
    eps = args.get("eps", 1e-5)
    if li < math.floor(args.get("alpha", 0.25) * len(model.layers)):
        return post_ln_block(x, layer, eps, attend)
    return pre_ln_block(x, layer, lambda z, site: rms(z, site.weight, eps), attend)


REFERENCES = {
    "mix_ln": SchemeReference(block=_block, cases=(Case({"alpha": 0.5}), Case({"alpha": 0.5}, {"qk_norm": "head"})))
}

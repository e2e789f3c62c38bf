"""``hybridnorm``: per-head q, k, v RMSNorms inside attention, ``h = N(x + Attn(x))``, ``y = h + MLP(h)``
(arXiv 2503.04598), and HybridNorm* with a Pre-LN first block; its float64 reference for the shared
per-scheme checks."""

from __future__ import annotations

from reference_model import Case, SchemeReference, attention_ref, mlp_ref, pre_ln_block, rms


def _attention(u, attn, config, args):
    eps = args.get("eps", 1e-5)  # the q, k and v norms take the scheme's eps
    return attention_ref(u, attn, config.rope_theta, eps, "head", v_norm_eps=eps)


def _block(x, layer, li, model, args, attend):
    eps = args.get("eps", 1e-5)
    if args.get("star", False) and li == 0:  # HybridNorm*: a Pre-LN first block
        return pre_ln_block(x, layer, lambda z, site: rms(z, site.weight, eps), attend)
    hn = rms(x + attend(x, layer.attn), layer.norms.attn_res.weight, eps)
    return hn + mlp_ref(hn, layer.mlp)


REFERENCES = {
    "hybridnorm": SchemeReference(
        block=_block,
        attention=_attention,
        final=lambda x, f, args: rms(x, f.weight, args.get("eps", 1e-5)),
        cases=(Case({"star": True, "eps": 1e-3}),),
    ),
}

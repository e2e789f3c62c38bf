"""``peri_ln``: RMSNorm before and after each sublayer, optionally on the embedding; its float64 reference
for the shared per-scheme checks."""

from __future__ import annotations

from reference_model import Case, SchemeReference, mlp_ref, rms


def _block(x, layer, li, model, args, attend):
    n = layer.norms
    h = x + rms(attend(rms(x, n.attn_in.weight, 1e-5), layer.attn), n.attn_out.weight, 1e-5)
    return h + rms(mlp_ref(rms(h, n.mlp_in.weight, 1e-5), layer.mlp), n.mlp_out.weight, 1e-5)


REFERENCES = {
    "peri_ln": SchemeReference(
        block=_block,
        embed=lambda x, model, args: rms(x, model.emb_norm.weight, 1e-5) if args.get("embed_norm", False) else x,
        cases=(Case({"embed_norm": True}),),
    ),
}

"""``reordered``: OLMo 2's reordered norm, ``h = x + N(Attn(x))``, ``y = h + N(MLP(h))``; its float64 reference
for the shared per-scheme checks."""

from __future__ import annotations

from reference_model import Case, SchemeReference, mlp_ref, rms


def _block(x, layer, li, model, args, attend):
    n, eps = layer.norms, args.get("eps", 1e-6)
    h = x + rms(attend(x, layer.attn), n.attn_out.weight, eps)
    return h + rms(mlp_ref(h, layer.mlp), n.mlp_out.weight, eps)


REFERENCES = {
    "reordered": SchemeReference(
        block=_block,
        final=lambda x, f, args: rms(x, f.weight, args.get("eps", 1e-6)),
        cases=(Case({"eps": 1e-3}), Case(overrides={"qk_norm": "full"})),
    ),
}

"""Conversion of ``rmsnorm`` models to and from Hugging Face ``LlamaForCausalLM``.

Only the ``rmsnorm`` scheme has a Hugging Face architecture; BHyT, DyT and the other schemes do
not, which is why evaluation runs our own model directly (``bhyt_pl.eval``). ``transformers`` is
a development dependency, imported only here.
"""

from __future__ import annotations

from typing import Any

import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Llama

__all__ = ["from_hf_llama", "hf_config", "hf_key_map", "to_hf_llama"]


def _require_rmsnorm(config: LlamaConfig) -> None:
    if config.norm != "rmsnorm":
        raise ValueError(f"only norm='rmsnorm' maps onto Hugging Face Llama; this model uses norm={config.norm!r}")
    if config.qk_norm:
        # LlamaForCausalLM has no query/key norms: a copy without them would compute something else
        raise ValueError("qk_norm=True does not map onto Hugging Face Llama (it has no q/k norms); use qk_norm=False")


def hf_key_map(config: LlamaConfig) -> dict[str, str]:
    """Our state-dict key -> Hugging Face Llama's key."""
    _require_rmsnorm(config)
    keys = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    if not config.tie_embeddings:
        keys["lm_head.weight"] = "lm_head.weight"
    for i in range(config.n_layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            keys[f"layers.{i}.attn.{name}.weight"] = f"model.layers.{i}.self_attn.{name}.weight"
        for name in ("gate_proj", "up_proj", "down_proj"):
            keys[f"layers.{i}.mlp.{name}.weight"] = f"model.layers.{i}.mlp.{name}.weight"
        keys[f"layers.{i}.norms.attn_in.weight"] = f"model.layers.{i}.input_layernorm.weight"
        keys[f"layers.{i}.norms.mlp_in.weight"] = f"model.layers.{i}.post_attention_layernorm.weight"
    return keys


def hf_config(config: LlamaConfig) -> Any:
    """The ``transformers.LlamaConfig`` of the same architecture."""
    import transformers

    _require_rmsnorm(config)
    return transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.mlp_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.norm_args.get("eps", 1e-5),
        tie_word_embeddings=config.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=config.init_std,
    )


def to_hf_llama(model: Llama) -> Any:
    """A ``transformers.LlamaForCausalLM`` with a copy of ``model``'s weights (same dtype)."""
    import transformers

    hf = transformers.LlamaForCausalLM(hf_config(model.config)).to(model.embed.weight.dtype)
    ours = model.state_dict()
    sd = {hf_key: ours[key].detach().clone() for key, hf_key in hf_key_map(model.config).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (model.config.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing={missing}, unexpected={unexpected}")
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def from_hf_llama(hf_model: Any) -> Llama:
    """Our ``rmsnorm`` model with the weights of a ``transformers.LlamaForCausalLM`` (default RoPE only)."""
    c = hf_model.config
    rope = getattr(c, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"RoPE scaling {rope.get('rope_type')!r} is not implemented; only the default RoPE maps")
    config = LlamaConfig(
        name="from-hf",
        vocab_size=c.vocab_size,
        dim=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        mlp_dim=c.intermediate_size,
        max_seq_len=c.max_position_embeddings,
        rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
        tie_embeddings=bool(c.tie_word_embeddings),
        norm="rmsnorm",
        norm_args={"eps": float(c.rms_norm_eps)},
    )
    hf_sd = hf_model.state_dict()
    qk_keys = [k for k in hf_sd if k.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight"))]
    if qk_keys:  # e.g. a Qwen3/OLMo-2-style model: dropping its q/k norms would silently change it
        raise ValueError(f"the Hugging Face model has query/key norms ({qk_keys[0]}, ...), which Llama does not map")
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device="cpu")
    model.load_state_dict({key: hf_sd[hf_key].float() for key, hf_key in hf_key_map(config).items()})
    return model.to(next(hf_model.parameters()).dtype)

"""The one mapping between ``LlamaConfig`` fields and the names of transformers' Llama config.

Export (``convert.hf_config``), import (``convert.from_hf_llama``) and the exported model's config
(``hf_modeling.BHyTLlamaConfig``) all read it, so a renamed or added size field changes one table.
RoPE and the norm's epsilon are not plain renames and stay with the converter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bhyt_pl.config import LlamaConfig

__all__ = ["HF_FIELDS", "from_hf_fields", "to_hf_fields"]

HF_FIELDS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "mlp_dim": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "max_seq_len": "max_position_embeddings",
    "init_std": "initializer_range",
    "tie_embeddings": "tie_word_embeddings",
}
"""``LlamaConfig`` field -> transformers ``LlamaConfig`` attribute of the same quantity."""


def to_hf_fields(config: LlamaConfig) -> dict[str, Any]:
    """The transformers-named values of ``config``'s sizes (``{"hidden_size": config.dim, ...}``)."""
    return {hf: getattr(config, ours) for ours, hf in HF_FIELDS.items()}


def from_hf_fields(hf_config: Any) -> dict[str, Any]:
    """``LlamaConfig`` fields from a transformers config; a value it lacks keeps our default (``head_dim``:
    ``hidden_size // num_attention_heads``)."""
    fields = {ours: getattr(hf_config, hf, None) for ours, hf in HF_FIELDS.items()}
    fields = {k: v for k, v in fields.items() if v is not None}
    if "tie_embeddings" in fields:
        fields["tie_embeddings"] = bool(fields["tie_embeddings"])
    return fields

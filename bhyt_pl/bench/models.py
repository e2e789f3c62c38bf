"""Models the benchmark times: ours for a variant, and the same ``rmsnorm`` weights in Hugging Face."""

from __future__ import annotations

from typing import Any

import torch

from bhyt_pl.bench.variants import Variant
from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Llama

__all__ = ["build_model", "compile_blocks", "hf_peer"]


def build_model(
    preset: str, variant: Variant, overrides: dict[str, Any], device: torch.device, dtype: torch.dtype, seq_len: int
):
    """``Llama`` of ``preset`` (with ``overrides``) for ``variant``, initialised from seed 0, its norm scheme
    bound to the benchmark's training length ``seq_len`` (BHyT's T)."""
    config = LlamaConfig.from_name(preset, norm=variant.norm, norm_args=dict(variant.norm_args), **overrides)
    config = config.bind(seq_len=seq_len)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device=device)
    model.reset_parameters()
    return model.to(dtype)


def compile_blocks(model: torch.nn.Module) -> torch.nn.Module:
    """The package's compile path (``LlamaLM(compile=True)``): each block in place;
    one graph serves every block of a model."""
    for layer in model.layers:
        layer.compile(dynamic=False)
    return model


def hf_peer(model: Llama) -> Any:
    """``transformers.LlamaForCausalLM`` with ``model``'s weights and SDPA attention, as ours uses."""
    from bhyt_pl.convert import to_hf_llama

    hf = to_hf_llama(model).to(model.embed.weight.device)
    hf.set_attn_implementation("sdpa")
    hf.generation_config.eos_token_id = None  # always generate the stated number of tokens
    hf.generation_config.pad_token_id = 0
    return hf

"""Models the benchmark times: ours for a variant, and the same ``rmsnorm`` weights in Hugging Face."""

from __future__ import annotations

from typing import Any

import torch

from bhyt_pl.model import Llama
from bhyt_pl.run_config import build_run_config
from bhyt_pl.run_facts import build_run_facts
from bhyt_pl.variants import Variant

__all__ = ["build_model", "compile_blocks", "hf_peer", "litgpt_available", "litgpt_peer"]


def build_model(
    preset: str,
    variant: Variant,
    overrides: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    seq_len: int,
    batch_size: int | None = None,
):
    """``Llama`` of ``preset`` (with ``overrides``) for ``variant``, initialised from seed 0, its config built by
    ``build_run_config`` with the run facts of the benchmark's settings (``build_run_facts``): the training
    length ``seq_len`` (BHyT's T) and the training ``batch_size``."""
    facts = build_run_facts(seq_len=seq_len, batch_size=batch_size)
    config = build_run_config(preset, variant.norm, variant.norm_args, overrides, facts)
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


def litgpt_available() -> bool:
    """litgpt is an optional peer (``pip install litgpt``), never a dependency."""
    import importlib.util

    return importlib.util.find_spec("litgpt") is not None


def litgpt_peer(model: Llama, compile: bool = False) -> Any:
    """litgpt's ``GPT`` with ``model``'s (``rmsnorm``) weights, via transformers' layout and litgpt's own
    converter (``copy_weights_hf_llama``); the output projection tied to the embedding as in ours.
    ``compile`` compiles each block in place, as ours is compiled."""
    from litgpt import GPT, Config
    from litgpt.scripts.convert_hf_checkpoint import copy_weights_hf_llama

    from bhyt_pl.convert import to_hf_llama

    c = model.config
    config = Config(
        name="bhyt_pl-peer",
        block_size=c.max_seq_len,
        vocab_size=c.vocab_size,
        padded_vocab_size=c.vocab_size,
        n_layer=c.n_layers,
        n_head=c.n_heads,
        n_query_groups=c.n_kv_heads,
        head_size=c.head_dim,
        n_embd=c.dim,
        intermediate_size=c.mlp_dim,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-5,
        mlp_class_name="LLaMAMLP",
        rope_base=int(c.rope_theta),
    )
    hf_state = {k: v.detach().float() for k, v in to_hf_llama(model).state_dict().items()}
    hf_state.setdefault("lm_head.weight", hf_state["model.embed_tokens.weight"])
    state: dict[str, torch.Tensor] = {}
    copy_weights_hf_llama(config, {}, state, hf_state)
    device, dtype = model.embed.weight.device, model.embed.weight.dtype
    with torch.device(device):
        peer = GPT(config)
    peer.load_state_dict(state, strict=False)
    peer.lm_head.weight = peer.transformer.wte.weight  # tied, as ours
    peer = peer.to(dtype)
    if compile:
        for block in peer.transformer.h:
            block.compile(dynamic=False)
    return peer

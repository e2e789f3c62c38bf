"""``bhyt_pl.bench.models``: the timed model is the preset bound to the run, from seed 0, and the Hugging Face
peer computes the same function with the same weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.bench.models import build_model, compile_blocks, hf_peer, litgpt_peer
from bhyt_pl.variants import parse_variant

CPU = torch.device("cpu")


def _variant(norm: str, **norm_args) -> SimpleNamespace:
    return SimpleNamespace(norm=norm, norm_args=norm_args, label=norm)


def test_build_model_is_the_preset_bound_to_seq_len_from_seed_zero() -> None:
    model = build_model("tiny", _variant("bhyt", lambda_attn=1.5), {"n_layers": 2}, CPU, torch.bfloat16, seq_len=48)
    assert model.config.n_layers == 2 and model.config.norm == "bhyt"
    assert model.config.norm_args == {"lambda_attn": 1.5, "seq_len": 48}  # the run fact bound
    assert model.embed.weight.dtype == torch.bfloat16 and not model.embed.weight.is_meta
    torch.manual_seed(123)  # whatever the global state: every variant starts from seed 0's weights
    again = build_model("tiny", _variant("bhyt", lambda_attn=1.5), {"n_layers": 2}, CPU, torch.bfloat16, seq_len=48)
    for (name, p), q in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert model.embed.weight.std() > 0


def test_hf_peer_computes_our_logits() -> None:
    model = build_model("tiny", _variant("rmsnorm"), {"n_layers": 2}, CPU, torch.float32, seq_len=16)
    hf = hf_peer(model)
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, model(tokens), atol=1e-4, rtol=1e-4)
    assert hf.config._attn_implementation == "sdpa" and hf.generation_config.eos_token_id is None


def test_compile_blocks_compiles_every_block_in_place() -> None:
    model = build_model("tiny", _variant("rmsnorm"), {"n_layers": 2}, CPU, torch.float32, seq_len=16)
    assert compile_blocks(model) is model
    assert all(layer._compiled_call_impl is not None for layer in model.layers)


def test_litgpt_peer_computes_our_logits() -> None:
    pytest.importorskip("litgpt")
    model = build_model("tiny", parse_variant("rmsnorm"), {"n_layers": 2}, torch.device("cpu"), torch.float32, 64)
    peer = litgpt_peer(model)
    idx = torch.randint(0, 8192, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(peer(idx), model(idx), atol=1e-5, rtol=1e-5)
    assert peer.lm_head.weight is peer.transformer.wte.weight

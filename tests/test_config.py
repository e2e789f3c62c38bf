"""LlamaConfig: presets as in the table of docs/method.md, overrides, and errors that name the field."""

from __future__ import annotations

import pytest

from bhyt_pl import PRESETS, LlamaConfig


def test_paper_presets_match_spec_table() -> None:
    table = {  # docs/method.md, section 5: d, layers, heads, kv heads, head dim, MLP
        "llama-374m": (1024, 16, 16, 4, 64, 4096),
        "llama-1b": (2048, 16, 32, 8, 64, 8192),
        "llama-3b": (3072, 28, 24, 8, 128, 8192),
    }
    for name, row in table.items():
        c = LlamaConfig.from_name(name)
        assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.mlp_dim) == row
        assert (c.vocab_size, c.rope_theta, c.tie_embeddings, c.init_std) == (128256, 500000.0, True, 0.02)


def test_cpu_presets_exist() -> None:
    assert {"tiny", "deep-16x64", "deep-24x128", "deep-32x128"} <= set(PRESETS)
    deep = LlamaConfig.from_name("deep-24x128")
    assert (deep.n_layers, deep.dim) == (24, 128)
    narrow = LlamaConfig.from_name("deep-16x64")  # 2 query heads of 32, one KV head, MLP 3 x 64
    shape = (narrow.n_layers, narrow.dim, narrow.n_heads, narrow.n_kv_heads, narrow.head_dim, narrow.mlp_dim)
    assert shape == (16, 64, 2, 1, 32, 192)
    assert (narrow.vocab_size, narrow.max_seq_len) == (deep.vocab_size, deep.max_seq_len) == (8192, 512)


def test_overrides_and_derived_head_dim() -> None:
    c = LlamaConfig.from_name("tiny", n_layers=7, norm="dyt", norm_args={"alpha_attn": 0.8})
    assert c.n_layers == 7 and c.norm == "dyt" and c.head_dim == 32 and c.name == "tiny"
    assert c.norm_scheme().alpha_attn == 0.8
    assert LlamaConfig(**c.to_dict()) == c


def test_unknown_preset_and_field() -> None:
    with pytest.raises(ValueError, match=r"unknown model preset 'llama-7b'; presets: llama-374m, llama-1b"):
        LlamaConfig.from_name("llama-7b")
    with pytest.raises(ValueError, match=r"unknown LlamaConfig field\(s\) \['layers'\]"):
        LlamaConfig.from_name("tiny", layers=3)


def test_invalid_values_collected() -> None:
    with pytest.raises(ValueError, match=r"(?s)dim must be a positive int, got 0.*n_layers must be a positive int"):
        LlamaConfig(dim=0, n_layers=-1)
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
        LlamaConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim must be even"):
        LlamaConfig(head_dim=5)
    with pytest.raises(ValueError, match="lambda_attn must be > 0"):
        LlamaConfig(norm="bhyt", norm_args={"lambda_attn": -1})


def test_qk_norm_field_is_validated() -> None:
    assert LlamaConfig.from_name("tiny").qk_norm is False
    c = LlamaConfig.from_name("tiny", qk_norm=True, norm="post_ln")
    assert LlamaConfig(**c.to_dict()) == c
    assert c.qk_norm == "head"  # true is the alias of "head"
    assert LlamaConfig.from_name("tiny", qk_norm="full").qk_norm_layout == "full"
    with pytest.raises(ValueError, match=r"qk_norm must be false, 'head', 'full' or true \(an alias .*got 'yes'"):
        LlamaConfig.from_name("tiny", qk_norm="yes")
    with pytest.raises(ValueError, match=r"qk_norm_eps must be > 0, got 0.0"):
        LlamaConfig.from_name("tiny", qk_norm_eps=0.0)

"""``bhyt_pl.bench.decode``: decode sizes on the command line, and where a profiled call's time goes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bhyt_pl.bench.decode import _category, parse_size, profile_generate


def test_parse_size() -> None:
    assert parse_size("llama-374m:2") == ("llama-374m", {"n_layers": 2})
    assert parse_size("tiny") == ("tiny", {})
    with pytest.raises(ValueError, match=r"--decode-sizes: 'small:two' must be preset or preset:n_layers"):
        parse_size("small:two")


def test_operators_fall_into_matmul_attention_and_other() -> None:
    assert [_category(n) for n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::_mkl_linear")] == ["matmul"] * 4
    assert _category("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert [_category(n) for n in ("aten::add", "aten::mul", "aten::linear")] == ["other"] * 3  # linear: its mm counts


def test_a_profiled_call_splits_its_wall_time_by_category() -> None:
    a = torch.randn(256, 256)
    q = torch.randn(1, 2, 64, 16)

    def call() -> None:
        for _ in range(4):
            a @ a
        F.scaled_dot_product_attention(q, q, q, is_causal=True)

    out = profile_generate(call)
    assert out["matmul_s"] > 0 and out["attention_s"] > 0 and out["other_s"] >= 0
    assert sum(out[f"{k}_fraction"] for k in ("matmul", "attention", "other")) == pytest.approx(1.0)
    assert out["matmul_s"] + out["attention_s"] <= out["wall_s"]
    assert profile_generate(lambda: a + a)["matmul_s"] == 0.0

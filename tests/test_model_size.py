"""The three parameter counts, tokens per parameter and a budget's steps, against hand computation from the presets'
dimensions (never against the functions themselves)."""

from __future__ import annotations

import pytest
import torch

from bhyt_pl import LlamaConfig
from bhyt_pl.flops import training_flops
from bhyt_pl.model import Llama
from bhyt_pl.model_size import (
    ModelSize,
    block_params,
    embedding_params,
    steps_for_tokens_per_param,
    tokens_per_param,
    total_params,
)

# per layer, dim 128, 4 heads of 32, 2 KV heads, MLP 384 (tiny and the deep-*x128 presets):
# q 128x128 + k 128x64 + v 128x64 + o 128x128 = 16384 + 8192 + 8192 + 16384 = 49152; MLP 3 x 128x384 = 147456
PER_LAYER_128 = 49152 + 147456  # 196608
# dim 64, 2 heads of 32, 1 KV head, MLP 192 (deep-16x64): q 4096 + k 2048 + v 2048 + o 4096 + 3 x 12288 = 49152
PER_LAYER_64 = 4096 + 2048 + 2048 + 4096 + 36864


@pytest.mark.parametrize(
    ("preset", "block", "embedding"),
    [
        ("tiny", 786_432, 1_048_576),  # 4 x 196608; 8192 x 128
        ("deep-32x128", 6_291_456, 1_048_576),  # 32 x 196608
        ("deep-16x64", 786_432, 524_288),  # 16 x 49152; 8192 x 64
    ],
)
def test_block_and_embedding_counts(preset: str, block: int, embedding: int) -> None:
    config = LlamaConfig.from_name(preset)
    assert block_params(config) == block
    assert embedding_params(config) == embedding
    assert PER_LAYER_128 * 4 == 786_432 and PER_LAYER_128 * 32 == 6_291_456 and PER_LAYER_64 * 16 == 786_432


@pytest.mark.parametrize(
    ("preset", "with_embedding", "norms"),
    [
        # RMSNorm: two gains of d per block and the final norm's d
        ("tiny", 1_835_008, 4 * 2 * 128 + 128),  # 1,836,160 in all
        ("deep-32x128", 7_340_032, 32 * 2 * 128 + 128),  # 7,348,352 in all
        ("deep-16x64", 1_310_720, 16 * 2 * 64 + 64),  # 786,432 + 524,288; 1,312,832 in all
    ],
)
def test_everything_is_blocks_embedding_and_norm_gains(preset: str, with_embedding: int, norms: int) -> None:
    config = LlamaConfig.from_name(preset, norm="rmsnorm")
    size = ModelSize.of(config)  # a meta-device build
    assert size.block_params + size.embedding_params == with_embedding
    assert size.total_params == with_embedding + norms  # the tied head adds nothing
    assert ModelSize.of(config, Llama(config)).total_params == with_embedding + norms  # a real build: the same


def test_an_untied_head_counts_as_its_own_matrix() -> None:
    config = LlamaConfig.from_name("tiny", tie_embeddings=False)
    assert ModelSize.of(config).total_params == 1_835_008 + 8192 * 128 + 4 * 2 * 128 + 128


def test_total_params_counts_a_shared_parameter_once() -> None:
    shared = torch.nn.Linear(3, 2, bias=False)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), torch.nn.Linear(2, 3, bias=True))
    model[2].weight = torch.nn.Parameter(torch.zeros(3, 2))
    model.append(shared)
    assert total_params(model) == 6 + 6 + 3


def test_a_meta_build_draws_no_random_numbers() -> None:
    torch.manual_seed(0)
    ModelSize.of(LlamaConfig.from_name("tiny", norm="bhyt"))
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))


def test_paper_preset_is_its_name() -> None:
    # llama-374m: 16 x (1024 x 64 x (32 + 8) + 3 x 1024 x 4096) = 243,269,632; embedding 128256 x 1024 = 131,334,144
    config = LlamaConfig.from_name("llama-374m")
    assert block_params(config) == 243_269_632 and embedding_params(config) == 131_334_144
    assert abs(243_269_632 + 131_334_144 - 374e6) / 374e6 < 0.01


def test_the_flops_count_blocks_and_output_projection() -> None:
    # deep-32x128 at T = 64: 2 x (6,291,456 + 8192 x 128) + 4 x (32 x 4 x 32) x 64, times 3
    from bhyt_pl.flops import training_flops_per_token

    expected = 3.0 * (2.0 * (6_291_456 + 1_048_576) + 4 * 4096 * 64)
    assert training_flops_per_token(LlamaConfig.from_name("deep-32x128"), 64) == expected
    assert training_flops(7_340_032, 4096, 64) == expected


def test_tokens_per_param() -> None:
    # the default study: 180 steps x 8 x 64 = 92,160 tokens over deep-32x128's P
    assert tokens_per_param(92_160, 6_291_456) == pytest.approx(0.0146484375)
    with pytest.raises(ValueError, match="block_params must be > 0, got 0"):
        tokens_per_param(1, 0)


@pytest.mark.parametrize(
    ("ratio", "steps"),
    [
        (1.0, 1536),  # deep-16x64: 786,432 / (8 x 64) = 1536
        (0.015, 23),  # 11,796.48 / 512 = 23.04 -> 23 (nearest)
        (20.0, 30720),
        (1e-6, 1),  # 0.0015 steps -> at least one
    ],
)
def test_steps_for_tokens_per_param(ratio: float, steps: int) -> None:
    assert steps_for_tokens_per_param(ratio, 786_432, 8 * 64) == steps


def test_a_half_step_rounds_up() -> None:
    assert steps_for_tokens_per_param(0.5, 1000, 200) == 3  # 2.5 steps: up, where round() would give 2
    assert steps_for_tokens_per_param(0.5, 1000, 400) == 1  # 1.25 -> 1


def test_steps_for_tokens_per_param_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="tokens per parameter must be > 0, got 0"):
        steps_for_tokens_per_param(0, 786_432, 512)
    with pytest.raises(ValueError, match="tokens_per_step must be > 0, got 786432 and 0"):
        steps_for_tokens_per_param(1.0, 786_432, 0)

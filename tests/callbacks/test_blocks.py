"""The block locator, and the callbacks inside a user's own LightningModule around transformers' Llama."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer
from test_depth_stats import MemoryLogger
from torch import nn

from bhyt_pl import Llama, LlamaConfig, LlamaLM
from bhyt_pl.callbacks import DepthStatsMonitor, StabilityMonitor, TokenThroughputMonitor, locate_blocks
from bhyt_pl.callbacks.throughput import estimated_training_flops_per_token
from bhyt_pl.flops import training_flops_per_token

transformers = pytest.importorskip("transformers")

HF_SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4)


def hf_llama(**kw) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(**{**HF_SIZES, "num_key_value_heads": 2, "tie_word_embeddings": False, **kw})
    return transformers.LlamaForCausalLM(config)


class UserLM(L.LightningModule):
    """What a user writes around a transformers model: no bhyt_pl class, no ``flops_per_batch``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = hf_llama()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.net(batch["input_ids"]).logits
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_depth_stats_and_throughput_in_a_user_module_around_transformers_llama() -> None:
    module, data, logger = UserLM(), TokenDataModule(seq_len=16, batch_size=4), MemoryLogger()
    ids = next(iter(data.train_dataloader()))["input_ids"]
    with torch.no_grad():  # reference: transformers' own hidden states before the first update
        hidden = module.net(ids, output_hidden_states=True).hidden_states  # embeddings, then each layer
    throughput = TokenThroughputMonitor(window_size=2)
    trainer = quiet_trainer(
        max_steps=3,
        logger=logger,
        log_every_n_steps=1,
        callbacks=[DepthStatsMonitor(every_n_steps=1), StabilityMonitor(every_n_steps=1, figures=False), throughput],
    )
    trainer.fit(module, data)
    for step in (1, 2, 3):
        logged = logger.history[step]
        for i in range(3):
            for stat in ("magnitude", "variance", "max_abs", "angular_distance"):
                assert f"depth/{stat}/layer_{i:02d}" in logged, (step, stat, i)
        assert not [k for k in logged if k.startswith(("depth/saturation", "depth/site_rms", "depth/lambda"))]
        for i in range(3):  # the stability statistics that need no bhyt_pl norm sites or q/k recomputation
            for stat in ("grad_norm", "act_grad_norm", "kurtosis", "max_over_median"):
                assert f"stability/{stat}/layer_{i:02d}" in logged, (step, stat, i)
    for i in range(2):  # the last hidden state of transformers is after the final norm: compare the others
        expected = hidden[i + 1].double().norm(dim=-1).mean().item()
        assert logger.history[1][f"depth/magnitude/layer_{i:02d}"] == pytest.approx(expected, rel=1e-5)
    located = locate_blocks(module)
    assert located.path == "net.model.layers" and not located.has_norm_sites
    flops = 16 * 4 * estimated_training_flops_per_token(located, 16)
    assert throughput.latest["train/flops_per_sec"] == pytest.approx(flops * throughput.latest["train/batches_per_sec"])


def test_flops_estimate_equals_the_formula_for_our_llama() -> None:
    config = LlamaConfig.from_name("tiny", **{**TINY_OVERRIDES, "tie_embeddings": False})
    hf = hf_llama(num_hidden_layers=2, max_position_embeddings=64)
    located = locate_blocks(hf)
    assert located.path == "model.layers"
    assert estimated_training_flops_per_token(located, 32) == training_flops_per_token(config, 32)
    ours = locate_blocks(Llama(config))
    assert estimated_training_flops_per_token(ours, 32) == training_flops_per_token(config, 32)


def test_locate_blocks_in_each_family_and_by_argument() -> None:
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32)
    lm.configure_model()
    ours = locate_blocks(lm)
    assert ours.path == "model.layers" and ours.owner is lm.model and len(ours) == 2
    assert set(ours.norm_sites(0)) == {"attn_in", "mlp_in"} and ours.block_norms(0) is lm.model.layers[0].norms
    qk = ours.qk_projections(1)
    assert qk.q is lm.model.layers[1].attn.q_proj and (qk.n_heads, qk.n_kv_heads, qk.head_dim) == (4, 2, 8)

    hf = hf_llama()
    qk = locate_blocks(hf).qk_projections(2)
    assert qk.k is hf.model.layers[2].self_attn.k_proj and (qk.n_heads, qk.n_kv_heads) == (4, 2)

    class GPT(nn.Module):  # litgpt's layout: transformer = ModuleDict(wte, h, ln_f), fused qkv projections
        def __init__(self) -> None:
            super().__init__()
            block = lambda: nn.ModuleDict({"attn": nn.ModuleDict({"qkv": nn.Linear(8, 24)})})  # noqa: E731
            self.transformer = nn.ModuleDict({"wte": nn.Embedding(10, 8), "h": nn.ModuleList([block(), block()])})
            self.lm_head = nn.Linear(8, 10)

    wrapper = nn.ModuleDict({"gpt": GPT()})
    litgpt = locate_blocks(wrapper)
    assert litgpt.path == "gpt.transformer.h" and len(litgpt) == 2 and litgpt.qk_projections(0) is None

    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stack = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    custom = Custom()
    with pytest.raises(ValueError, match="no transformer blocks found in Custom"):
        locate_blocks(custom)
    assert locate_blocks(custom, "stack").blocks == tuple(custom.stack)
    assert locate_blocks(custom, lambda m: list(m.stack)[:2]).blocks == tuple(custom.stack)[:2]
    with pytest.raises(ValueError, match="blocks='stak' does not name a non-empty list of modules"):
        locate_blocks(custom, "stak")
    with pytest.raises(TypeError, match="blocks must be None, a dotted path or a callable"):
        locate_blocks(custom, 3)

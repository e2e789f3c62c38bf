"""What a study run measures on its model (``bhyt_pl.study.run.measure``), against references computed here: layer
importance against full forwards with a block removed, depth statistics against float64 formulas (the median token
and the magnitude without the two largest channels included), and a trajectory point's profiles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl.module import LlamaLM
from bhyt_pl.study.protocol.metrics import trajectory_point
from bhyt_pl.study.run.measure import depth_statistics, layer_importance, stability_summary


def _module(norm: str) -> LlamaLM:
    overrides = {"n_layers": 4, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 64, "vocab_size": 128}
    overrides["init_std"] = 0.2  # blocks that change the loss visibly: the deltas compared are not ~0
    module = LlamaLM(preset="tiny", overrides=overrides, norm=norm, seq_len=16)
    module.configure_model()
    return module


def _reference_importance(module: LlamaLM, batches: list[dict[str, torch.Tensor]]) -> tuple[float, list[float]]:
    """Full forwards of a model without block ``i`` (an ``nn.Identity``-like pass-through); the loss in float64."""

    class Skip(nn.Module):
        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            return x

    def loss(model: nn.Module) -> float:
        total, count = 0.0, 0
        for b in batches:
            logits = model(b["input_ids"]).double()
            total += float(F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum"))
            count += b["labels"].numel()
        return total / count

    model = module.model.eval()
    base = loss(model)
    deltas = []
    for i in range(len(model.layers)):
        block, model.layers[i] = model.layers[i], Skip()
        deltas.append(loss(model) - base)
        model.layers[i] = block
    return base, deltas


def test_layer_importance_matches_full_forwards_without_each_block() -> None:
    torch.manual_seed(0)
    module = _module("bhyt")
    batches = [{"input_ids": torch.randint(0, 128, (2, 16)), "labels": torch.randint(0, 128, (2, 16))}]
    batches.append({"input_ids": torch.randint(0, 128, (2, 16)), "labels": torch.randint(0, 128, (2, 16))})
    blocks = list(module.model.layers)
    module.model.train()
    base, deltas = layer_importance(module, batches)
    assert module.model.training  # mode restored
    assert list(module.model.layers) == blocks  # every block back in place
    ref_base, ref_deltas = _reference_importance(module, batches)
    assert base == pytest.approx(ref_base, rel=1e-5)
    assert deltas == pytest.approx(ref_deltas, rel=1e-3, abs=1e-5)
    assert min(abs(d) for d in deltas) > 1e-2  # every block matters: the comparison is not of zeros


@torch.no_grad()
def _block_outputs(module: LlamaLM, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output on ``ids`` in eval mode, float64, from blocks run one by one."""
    model = module.model.eval()
    x = model.emb_norm(model.embed(ids))
    cos, sin = model.rope(0, ids.shape[1], ids.device, x.dtype)
    outputs = []
    for block in model.layers:
        x = block(x, cos, sin)
        outputs.append(x.double())
    return outputs


def test_depth_statistics_against_float64_references_over_several_batches() -> None:
    torch.manual_seed(0)
    module = _module("rmsnorm")
    batches = [{"input_ids": torch.randint(0, 128, (2, 16)), "labels": torch.randint(0, 128, (2, 16))} for _ in "ab"]
    module.model.train()
    stats = depth_statistics(module, batches)
    assert module.model.training  # mode restored
    per_batch = [_block_outputs(module, b["input_ids"]) for b in batches]
    for i in range(4):
        ys = [outputs[i] for outputs in per_batch]  # [2, 16, 32] each
        norms = torch.cat([y.norm(dim=-1).flatten() for y in ys])
        assert stats[f"magnitude/layer_0{i}"] == pytest.approx(norms.mean().item(), rel=1e-5)
        # the median token: position 0 of every sequence left out, the lower middle of an even count
        tail = torch.cat([y[:, 1:].norm(dim=-1).flatten() for y in ys]).sort().values
        assert stats[f"median_magnitude/layer_0{i}"] == pytest.approx(tail[(len(tail) - 1) // 2].item(), rel=1e-5)
        # without the two channels of largest mean |y|, chosen per batch
        kept = []
        for y in ys:
            drop = y.abs().mean(dim=(0, 1)).topk(2).indices
            keep = torch.ones(y.shape[-1], dtype=torch.bool)
            keep[drop] = False
            kept.append(y[..., keep].norm(dim=-1).flatten())
        assert stats[f"magnitude_top2_removed/layer_0{i}"] == pytest.approx(torch.cat(kept).mean().item(), rel=1e-5)
        assert stats[f"magnitude_top2_removed/layer_0{i}"] < stats[f"magnitude/layer_0{i}"]
    logits = [module.model(b["input_ids"]).double() for b in batches]
    loss = sum(
        F.cross_entropy(lg.flatten(0, 1), b["labels"].flatten(), reduction="sum")
        for lg, b in zip(logits, batches, strict=True)
    )
    assert stats["val_loss"] == pytest.approx(float(loss) / 64, rel=1e-5)


def test_a_trajectory_point_holds_each_recorded_profile_and_the_loss() -> None:
    stats = {"magnitude/layer_00": 2.0, "magnitude/layer_01": 4.0, "variance/layer_01": 9.0, "val_loss": 3.5}
    stats.update({"saturation/attn_in/layer_00": 0.2, "saturation/mlp_in/layer_00": 0.4})
    stats["lambda/attn_in/layer_00"] = 2.0
    point = trajectory_point(7, stats)
    assert point["step"] == 7 and point["val_loss"] == 3.5
    assert point["magnitude"] == [2.0, 4.0] and point["variance"] == [9.0]
    assert point["saturation"] == [pytest.approx(0.3)]  # the mean over the layer's sites
    assert point["median_magnitude"] == [] and "lambda" not in point  # not recorded along training


def test_stability_summary_reads_the_logged_columns() -> None:
    metrics = {
        "stability/grad_norm/layer_00": [(5, 1.0), (10, 3.0)],
        "stability/grad_norm/layer_01": [(5, 2.0), (10, math.nan)],
        "stability/grad_norm/attn_in/layer_01": [(5, 99.0)],  # a site's, not the block's
        "stability/attn_entropy/layer_01": [(5, 0.7)],
        "stability/loss_spikes": [(5, 0.0), (10, 2.0)],
    }
    summary = stability_summary(metrics, n_layers=2)
    assert summary["loss_spikes"] == 2 and summary["grad_norm_spikes"] == 0
    steps = [(s["step"], s["max_grad_layer"], s["max_grad_norm"]) for s in summary["steps"]]
    assert steps == [(5, 2, 2.0), (10, 1, 3.0)]
    assert summary["steps"][0]["last_attn_entropy"] == 0.7 and math.isnan(summary["steps"][1]["last_attn_entropy"])

"""One study run's measurements (``bhyt_pl.study.runner``) against independent references: layer importance
against full forwards with a block removed, and the fast training path against the eager one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl.module import LlamaLM
from bhyt_pl.study import command
from bhyt_pl.study.measure import layer_importance
from bhyt_pl.study.runner import COMPILE_LOSS_TOLERANCE, RunSpec, TrainerSettings, run_one


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


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["rmsnorm", "bhyt"])
def test_compiled_run_matches_the_eager_run_within_the_documented_tolerance(norm: str, tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    factory = setup.data
    batches = setup.validation_batches()[:1]
    spec = RunSpec(
        label=norm,
        norm=norm,
        overrides={"n_layers": 2},
        steps=8,
        lr=1e-2,
        trajectory_every=4,
        stability_every=4,
        spike_window=4,
        importance=True,
    )
    eager = run_one(spec, factory, batches, TrainerSettings(), tmp_path / "eager")
    counters.clear()
    compiled = run_one(spec, factory, batches, TrainerSettings(compile=True), tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] >= 1  # the compiled path did compile
    assert eager.status == compiled.status == "ok", (eager.error, compiled.error)
    steps = [s for s, _ in eager.losses]
    assert steps == [s for s, _ in compiled.losses] and len(steps) == spec.steps
    assert eager.losses[-1][1] < eager.losses[0][1] - 0.05  # it trains: the losses compared move
    for (step, a), (_, b) in zip(eager.losses, compiled.losses, strict=True):
        assert abs(a - b) <= COMPILE_LOSS_TOLERANCE, f"step {step}: eager {a}, compiled {b}"
    assert abs(eager.val_loss - compiled.val_loss) <= COMPILE_LOSS_TOLERANCE
    assert len(compiled.trajectory) == len(eager.trajectory) == 3  # steps 0, 4 and the end
    assert compiled.importance == pytest.approx(eager.importance, abs=COMPILE_LOSS_TOLERANCE)


def test_workers_default_to_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert command.default_workers() == 3
    assert command.parser().parse_args([]).workers == 3
    monkeypatch.delattr(command.os, "sched_getaffinity")
    monkeypatch.setattr(command.os, "cpu_count", lambda: None)
    assert command.default_workers() == 1


def test_compile_flag_defaults_and_switches() -> None:
    assert command.parser().parse_args([]).compile is command.COMPILE_DEFAULT is True  # the documented default
    assert command.parser().parse_args(["--compile"]).compile is True
    assert command.parser().parse_args(["--no-compile"]).compile is False

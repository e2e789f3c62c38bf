"""One study run (``bhyt_pl.study.run.runner``): the compiled training path against the eager one, and the run's record
read back from its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bhyt_pl import strict_json
from bhyt_pl.study.cli import exploration as command
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, TrainerSettings, run_dirname
from bhyt_pl.study.run.runner import COMPILE_LOSS_TOLERANCE, run_one


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


def test_a_run_that_fails_is_recorded_and_its_record_reads_back(tmp_path: Path) -> None:
    def no_data(seed: int):
        raise RuntimeError(f"no data for seed {seed}")

    spec = RunSpec(label="dyt:alpha_attn=0.5@lr0.01-s1", norm="dyt", norm_args={"alpha_attn": 0.5}, data_seed=43)
    result = run_one(spec, no_data, [], TrainerSettings(), tmp_path)  # never raises for the run's own failure
    assert result.status == "error" and result.error == "RuntimeError: no data for seed 43"
    path = tmp_path / "runs" / "dyt_alpha_attn=0.5@lr0.01-s1" / "result.json"
    assert run_dirname(spec.label) == path.parent.name
    back = RunResult.from_dict(strict_json.loads(path.read_text()))  # NaN written as the string "NaN"
    assert back.spec == spec and back.status == "error" and math.isnan(back.val_loss)
    full = RunResult(spec, losses=[(1, 5.0), (2, 4.5)], depth_final={"magnitude/layer_00": 2.0}, val_loss=4.0)
    again = RunResult.from_dict(json.loads(json.dumps(full.to_dict())))
    assert again.losses == [(1, 5.0), (2, 4.5)] and again.spec == spec  # tuples and a RunSpec again
    assert json.dumps(again.to_dict()) == json.dumps(full.to_dict())


def test_a_runs_record_holds_its_size(tmp_path: Path) -> None:
    # deep-32x128 at 2 layers: P = 2 x (128 x 32 x (8 + 4) + 3 x 128 x 384) = 2 x 196,608 = 393,216; embedding
    # 8192 x 128 = 1,048,576; everything adds RMSNorm's gains, 2 x 2 x 128 + 128 = 640. 3 steps x 2 x 32 = 192 tokens.
    # One pass over the embedded corpus at 32 + 1 a window: 948,868 // 33 = 28,753 windows, 14,376 batches of 2
    # x 32 = 920,064 tokens.
    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    spec = RunSpec(label="rmsnorm", norm="rmsnorm", overrides={"n_layers": 2}, steps=3, lr=1e-2)
    run_one(spec, setup.data, setup.validation_batches()[:1], TrainerSettings(), tmp_path)
    record = strict_json.loads((tmp_path / "runs" / "rmsnorm" / "result.json").read_text())
    assert record["status"] == "ok"
    sizes = (record["block_params"], record["embedding_params"], record["total_params"])
    assert sizes == (393_216, 1_048_576, 1_442_432)
    assert record["tokens"] == 192 and record["tokens_per_param"] == pytest.approx(192 / 393_216)
    assert (record["corpus_tokens"], record["unique_tokens"]) == (920_064, 192)
    assert record["epochs"] == pytest.approx(192 / 920_064)

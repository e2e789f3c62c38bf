"""``python -m bhyt_pl study``: the quick mode end to end on a tiny budget, divergence detection, a failing
run that does not end the study, the sweep grid, and argument errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.study import main, runner
from bhyt_pl.study.command import parser, resolve
from bhyt_pl.study.report import TABLE_COLUMNS
from bhyt_pl.study.runner import DivergenceMonitor

# a tiny budget on top of --quick: 2 layers, a few steps of 2 x 32 tokens
TINY = ["--quick", "--layers", "2", "--steps", "3", "--seq-len", "32", "--batch-size", "2", "--val-batches", "1"]
TINY += ["--shuffle-buffer", "4"]


def _runs(out: Path) -> dict[str, dict]:
    return {r["spec"]["label"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


@pytest.mark.slow
def test_quick_study_writes_table_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "study"
    assert main([*TINY, "--schemes", "rmsnorm", "bhyt", "--out", str(out)]) == 0
    for name in ("report.md", "results.json", "depth_init.png", "depth_final.png", "loss.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "depth_final.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    assert "| " + " | ".join(TABLE_COLUMNS) + " |" in text
    runs = _runs(out)
    assert list(runs) == ["rmsnorm", "bhyt"]
    for r in runs.values():
        assert r["status"] == "ok" and r["steps_done"] == 3 and r["n_layers"] == 2
        assert math.isfinite(r["train_loss"]) and math.isfinite(r["val_loss"]) and r["tokens_per_sec"] > 0
        assert r["val_perplexity"] == pytest.approx(math.exp(r["val_loss"]), rel=1e-4)
        for which in ("depth_init", "depth_final"):
            assert {"magnitude/layer_00", "magnitude/layer_01", "variance/layer_01"} <= set(r[which])
        assert (out / r["log_dir"] / "metrics.csv").exists()
    # same seed, data and fixed batch: the init statistics of the embedding-fed first block input agree in size
    assert runs["rmsnorm"]["variance_bound"] is None
    bound = runs["bhyt"]["variance_bound"]  # L = 2: 2/10 and 1/10 < 1/sqrt(2)
    assert bound["n_layers"] == 2 and bound["at_init"] == {"lambda_attn": True, "lambda_mlp": True, "all": True}
    assert bound["threshold"] == pytest.approx(1 / math.sqrt(2))
    assert "| bhyt | 2 | 10 | 0.707 | 0.2 | 0.1 | yes |" in text


@pytest.mark.slow
def test_divergent_runs_are_reported_and_keep_partial_logs(tmp_path: Path) -> None:
    out = tmp_path / "diverge"
    # lr 100: the first update wrecks the weights; the study goes on and exits 0 (divergence is a result)
    assert main([*TINY, "--steps", "6", "--lr", "100", "--schemes", "rmsnorm", "bhyt", "--out", str(out)]) == 0
    runs = _runs(out)
    for label, r in runs.items():
        assert r["status"] == "diverged", label
        assert r["diverged_step"] is not None and r["diverged_step"] < 6
        assert not math.isfinite(r["diverged_loss"]) or r["diverged_loss"] > r["spec"]["max_loss"]
        assert r["steps_done"] == r["diverged_step"]  # stopped there, not trained on
        assert (out / r["log_dir"] / "metrics.csv").read_text().count("\n") >= 2  # header + logged steps
        assert len(r["losses"]) == r["diverged_step"]
    assert "yes, step" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_failing_run_is_recorded_and_the_study_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.LlamaLM

    def flaky(*args, **kwargs):
        if kwargs.get("norm") == "rmsnorm":
            raise RuntimeError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "LlamaLM", flaky)
    out = tmp_path / "error"
    assert main([*TINY, "--steps", "2", "--schemes", "rmsnorm", "lns", "--out", str(out)]) == 1
    runs = _runs(out)
    assert runs["rmsnorm"]["status"] == "error" and "simulated out of memory" in runs["rmsnorm"]["error"]
    assert runs["lns"]["status"] == "ok"
    assert "error: RuntimeError: simulated out of memory" in (out / "report.md").read_text()


@pytest.mark.slow
def test_quick_sweep_grid(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    argv = ["--sweep", "--quick", "--steps", "2", "--depths", "1", "2", "--lrs", "1e-3", "100", "--seq-len", "32"]
    argv += ["--shuffle-buffer", "4"]
    assert main([*argv, "--batch-size", "2", "--schemes", "rmsnorm", "--out", str(out)]) == 0
    runs = _runs(out)
    assert sorted(runs) == ["rmsnorm@L1-lr0.001", "rmsnorm@L1-lr100", "rmsnorm@L2-lr0.001", "rmsnorm@L2-lr100"]
    assert {r["status"] for label, r in runs.items() if "lr100" in label} == {"diverged"}
    assert {r["status"] for label, r in runs.items() if "lr0.001" in label} == {"ok"}
    assert [r["n_layers"] for r in runs.values()] == [1, 1, 2, 2]
    text = (out / "report.md").read_text()
    assert "| scheme | layers | lr 0.001 | lr 100 |" in text and "**diverged** @" in text
    assert (out / "sweep_grid.png").stat().st_size > 0


def _fake_trainer(step: int) -> SimpleNamespace:
    strategy = SimpleNamespace(reduce=lambda t, reduce_op: t)
    return SimpleNamespace(global_step=step, world_size=1, should_stop=False, strategy=strategy)


@pytest.mark.parametrize(("loss", "diverged"), [(4.0, False), (5.5, True), (math.nan, True), (math.inf, True)])
def test_divergence_monitor_bound(loss: float, diverged: bool) -> None:
    monitor = DivergenceMonitor(max_loss=5.0)
    trainer = _fake_trainer(7)
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    monitor.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, batch, 0)
    assert trainer.should_stop is diverged
    assert monitor.diverged_step == (7 if diverged else None)
    assert monitor.tokens == 6 and monitor.losses[0][0] == 7


def test_divergence_monitor_rejects_bad_bound() -> None:
    with pytest.raises(ValueError, match="max_loss must be > 0"):
        DivergenceMonitor(max_loss=0.0)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--steps", "0"], "--steps must be >= 1"),
        (["--override", "dimension"], "must be FIELD=VALUE"),
        (["--override", "not_a_field=3"], "unknown LlamaConfig field"),
        (["--seq-len", "4096"], "exceeds the preset's max_seq_len=512"),
        (["--sweep", "--layers", "4"], "--layers does not apply to --sweep"),
        (["--sweep", "--lrs", "0"], "--lrs > 0"),
    ],
)
def test_argument_errors(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve(parser().parse_args(argv))


def test_bad_arguments_exit_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--schemes", "nonorm", "--out", str(tmp_path / "x")]) == 2
    assert "unknown scheme 'nonorm'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_quick_defaults_are_smaller_than_full() -> None:
    quick, _ = resolve(parser().parse_args(["--quick"]))
    full, overrides = resolve(parser().parse_args([]))
    assert full.preset == "deep-32x128" and overrides == {}
    assert quick.steps * quick.seq_len * (quick.layers or 32) < full.steps * full.seq_len * 32

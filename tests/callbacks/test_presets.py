"""The YAML presets in callbacks/ parse, stack on any recipe with ``callbacks+``, and build their callbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bhyt_pl.callbacks import DepthStatsMonitor, NormConstantRefresh, StabilityMonitor, TokenThroughputMonitor
from bhyt_pl.cli import main

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "callbacks").glob("*.yaml"))
TINY = str(ROOT / "recipes" / "tiny.yaml")


def callback_classes(cli) -> list[type]:
    return [type(cb) for cb in cli.trainer.callbacks]


def test_every_preset_appends_with_callbacks_plus() -> None:
    assert {p.stem for p in PRESETS} >= {"depth_stats", "throughput", "norm_refresh", "paper", "stability"}
    for preset in PRESETS:
        trainer = yaml.safe_load(preset.read_text())["trainer"]
        assert list(trainer) == ["callbacks+"], preset.name  # append, never replace the recipe's list


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_each_preset_builds_on_the_tiny_recipe(preset: Path, tmp_path: Path) -> None:
    cli = main(["--config", TINY, "--config", str(preset), "--runs_dir", str(tmp_path)], run=False)
    expected = {
        "depth_stats": [DepthStatsMonitor],
        "throughput": [TokenThroughputMonitor],
        "norm_refresh": [NormConstantRefresh],
        "stability": [StabilityMonitor],
        "paper": [DepthStatsMonitor, StabilityMonitor, TokenThroughputMonitor],
    }[preset.stem]
    assert [c for c in callback_classes(cli) if c in expected] == expected


def test_two_presets_stack_on_a_recipe(tmp_path: Path) -> None:
    args = ["--config", TINY, "--config", str(ROOT / "callbacks" / "depth_stats.yaml"),
            "--config", str(ROOT / "callbacks" / "throughput.yaml"), "--runs_dir", str(tmp_path),
            "--trainer.callbacks+=bhyt_pl.callbacks.NormConstantRefresh",
            "--trainer.callbacks.every_n_steps=3"]  # fmt: skip
    cli = main(args, run=False)
    classes = callback_classes(cli)
    assert DepthStatsMonitor in classes and TokenThroughputMonitor in classes and NormConstantRefresh in classes
    depth = next(cb for cb in cli.trainer.callbacks if isinstance(cb, DepthStatsMonitor))
    assert depth.every_n_steps == 100
    refresh = next(cb for cb in cli.trainer.callbacks if isinstance(cb, NormConstantRefresh))
    assert refresh.every_n_steps == 3

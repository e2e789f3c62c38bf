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


def test_the_default_recipe_has_depth_statistics_and_a_preset_replaces_them(tmp_path: Path) -> None:
    """The quick start logged 18 scalar tags and no figure; a preset stacked on it must not add a second monitor
    (two would log every depth tag twice)."""

    def monitors(*configs: str, extra: tuple[str, ...] = ()) -> list[DepthStatsMonitor]:
        args = [a for c in (TINY, *configs) for a in ("--config", c)]
        cli = main([*args, "--runs_dir", str(tmp_path), *extra], run=False)
        return [cb for cb in cli.trainer.callbacks if isinstance(cb, DepthStatsMonitor)]

    (default,) = monitors()
    # at the recipe's validation points: val_check_interval is 50
    settings = (default.every_n_steps, default.validation, default.figures, default.log_first_step)
    assert settings == (50, True, True, True)
    (preset,) = monitors(str(ROOT / "callbacks" / "depth_stats.yaml"))
    assert (preset.every_n_steps, preset.validation) == (100, False)  # the preset's settings, not a merge
    (paper,) = monitors(str(ROOT / "callbacks" / "paper.yaml"), str(ROOT / "callbacks" / "depth_stats.yaml"))
    assert paper.validation is False  # the later of two presets wins
    line = ("--trainer.callbacks+=bhyt_pl.callbacks.DepthStatsMonitor", "--trainer.callbacks.every_n_steps=10")
    (command_line,) = monitors(extra=line)
    assert command_line.every_n_steps == 10
    stability = main(["--config", TINY, "--config", str(ROOT / "callbacks" / "stability.yaml"), "--config",
                      str(ROOT / "callbacks" / "paper.yaml"), "--runs_dir", str(tmp_path)], run=False)  # fmt: skip
    assert sum(isinstance(cb, StabilityMonitor) for cb in stability.trainer.callbacks) == 1

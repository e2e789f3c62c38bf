"""The launcher's typed options (``bhyt_pl.study.launch.options.LaunchOptions``): picked from the parsed command line,
turned into each executor's settings, with the flags its executor ignores named once, as the launcher is made."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.cluster_settings import LocalSettings, SlurmSettings
from bhyt_pl.study.launch.options import (
    LAUNCHERS,
    LaunchOptions,
    add_launcher_arguments,
    cluster_settings,
    interrupted_runs,
    make_launcher,
    study_folder,
)


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_launcher_arguments(parser)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--out", default="x")  # not a launcher option: ignored
    return parser.parse_args(list(argv))


def test_from_values_picks_the_launcher_flags_and_keeps_the_defaults_of_the_rest() -> None:
    options = LaunchOptions.from_values(vars(_parsed("--launcher", "slurm", "--sbatch", "a=1", "--setup", "x", "y")))
    assert options.launcher == "slurm" and options.sbatch == ("a=1",) and options.setup == ("x", "y")
    assert options == LaunchOptions(launcher="slurm", sbatch=("a=1",), setup=("x", "y"))  # --out left out
    assert LaunchOptions.from_values({}) == LaunchOptions() and LaunchOptions().launcher == "pool"
    with pytest.raises(UsageError, match="--launcher must be one of pool, local, slurm, got 'pbs'"):
        LaunchOptions(launcher="pbs")
    assert LAUNCHERS == ("pool", "local", "slurm")


def test_each_launcher_gets_its_executors_settings() -> None:
    assert cluster_settings(LaunchOptions()) is None
    assert type(cluster_settings(LaunchOptions(launcher="local", partition="gpu"))) is LocalSettings
    slurm = cluster_settings(LaunchOptions(launcher="slurm", partition="gpu", sbatch=("exclusive", "c=a100")))
    assert type(slurm) is SlurmSettings and slurm.additional_parameters == {"exclusive": True, "c": "a100"}


def test_flags_the_local_executor_ignores_are_named_once_when_the_launcher_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = LaunchOptions(launcher="local", partition="gpu", setup=("module load x",), mem_gb=4.0)
    with caplog.at_level(logging.WARNING):
        cluster_settings(options)  # the check before any work: says nothing yet
        assert caplog.messages == []
        launcher = make_launcher(options, len, tmp_path / "s", None)
    launcher.close()
    assert caplog.messages == [
        f"cluster settings: {name} is ignored by the local executor" for name in ("partition", "mem_gb", "setup")
    ]


def test_an_interrupted_driver_says_what_becomes_of_its_runs() -> None:
    assert interrupted_runs("pool") == "this machine's workers stop"
    assert interrupted_runs("local").startswith("its local jobs go on unless the interrupt reached them")
    assert interrupted_runs("slurm") == "its queued and running jobs go on"


def test_a_job_launcher_is_told_the_study_folder_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = Path("runs/study")
    assert study_folder(LaunchOptions(launcher="pool"), relative) == relative  # this machine: as given
    for launcher in ("local", "slurm"):  # its jobs start in another working directory
        assert study_folder(LaunchOptions(launcher=launcher), relative) == tmp_path / "runs" / "study"

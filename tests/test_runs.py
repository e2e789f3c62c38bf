"""Run folders: atomic version claims under concurrency, the ``last`` lookup across versions and layouts."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from bhyt_pl.runs import RunLogger, checkpoint_run_version, claim_version, find_last_checkpoint


def _claim(run_dir: str, barrier, out) -> None:  # noqa: ANN001 - multiprocessing objects
    barrier.wait()  # every process scans the same empty folder, then races for version_0
    out.put(claim_version(run_dir))


@pytest.mark.slow  # six processes
def test_runs_started_at_the_same_instant_get_distinct_versions(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    n = 6
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path / "run"), barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    versions = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert versions == list(range(n))  # Lightning's listing-based choice gave several processes version_0
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [f"version_{i}" for i in range(n)]


def test_run_logger_claims_its_folder_when_the_version_is_first_needed(tmp_path: Path) -> None:
    (tmp_path / "run" / "version_0").mkdir(parents=True)
    first, second = RunLogger(str(tmp_path), name="run"), RunLogger(str(tmp_path), name="run")
    assert (first.version, second.version) == (1, 2)  # both before either wrote anything
    resumed = RunLogger(str(tmp_path), name="run", version=0)
    assert resumed.log_dir == str(tmp_path / "run" / "version_0")


def _touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_last_is_the_newest_versions_last_checkpoint_and_the_old_layout_is_found(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert find_last_checkpoint(run) is None
    now = time.time()
    legacy = _touch(run / "checkpoints" / "last.ckpt", now - 30)
    _touch(run / "checkpoints" / "last-v1.ckpt", now - 20)  # a re-run in the old layout wrote last-v1
    assert find_last_checkpoint(run) == run / "checkpoints" / "last-v1.ckpt"
    os.utime(legacy, (now, now))
    assert find_last_checkpoint(run) == legacy
    v0 = _touch(run / "version_0" / "checkpoints" / "last.ckpt", now - 100)
    (run / "version_1").mkdir()  # a validate run's log folder: no checkpoints
    assert find_last_checkpoint(run) == v0
    v2 = run / "version_2" / "checkpoints" / "last.ckpt"
    v2.mkdir(parents=True)  # a sharded (FSDP2) checkpoint is a folder
    assert find_last_checkpoint(run) == v2


def test_checkpoint_run_version_reads_the_layout(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "tiny-bhyt" / "version_3" / "checkpoints" / "last.ckpt"
    assert checkpoint_run_version(path) == (tmp_path / "runs", "tiny-bhyt", 3)
    assert checkpoint_run_version(tmp_path / "runs" / "tiny-bhyt" / "checkpoints" / "last.ckpt") is None
    assert checkpoint_run_version(tmp_path / "model.ckpt") is None


def test_the_run_logger_sets_no_hp_metric_placeholder(tmp_path: Path) -> None:
    """TensorBoard showed ``hp_metric = -1`` for every run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bhyt_pl.runs import RunLogger

    logger = RunLogger(str(tmp_path), name="run")
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train/loss": 2.0}, step=1)
    logger.finalize("success")
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert "hp_metric" not in events.Tags()["scalars"] and "train/loss" in events.Tags()["scalars"]

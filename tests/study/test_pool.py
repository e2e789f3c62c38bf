"""The process pool (``bhyt_pl.study.launch.pool``): it implements the launcher protocol, reports a run that raised
as failed, and a small study trained through it gives the inline launcher's results; on GPUs (their
count mocked: no GPU here) each pool worker owns one visible GPU, also after a worker died."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from bhyt_pl.errors import UsageError
from bhyt_pl.study import main
from bhyt_pl.study.launch import pool as local
from bhyt_pl.study.launch.launcher import Launcher, RunState
from bhyt_pl.study.launch.pool import ProcessPoolLauncher, available_cpus, local_workers
from bhyt_pl.study.protocol.spec import RunResult, RunSpec


def scripted_run(spec: RunSpec) -> RunResult:
    """A run whose validation loss is its learning rate, trained in whichever process calls it; ``boom`` raises.
    ``stability`` carries the process's pid and ``CUDA_VISIBLE_DEVICES`` (None: unset).

    ``norm_args={"meet": DIR, "workers": N}``: waits until N processes have each started such a run (a pid file in
    DIR each), so N such runs started together go to N different workers. ``crash`` kills its worker."""
    if spec.norm == "boom":
        raise RuntimeError(f"no run for {spec.label}")
    if spec.norm == "crash":
        os._exit(3)
    if "meet" in spec.norm_args:
        meet = Path(spec.norm_args["meet"])
        (meet / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(meet.iterdir())) < spec.norm_args["workers"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{spec.label}: fewer than {spec.norm_args['workers']} workers in {meet}")
            time.sleep(0.02)
    seen = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    return RunResult(spec, val_loss=spec.lr, tokens=os.getpid(), stability=seen)


SPECS = [RunSpec(label=f"r{i}", norm="rmsnorm", lr=float(i)) for i in range(4)]


def _drain(launcher: Launcher, n: int) -> list:
    final: list = []
    while len(final) < n:
        final += [e for e in launcher.poll(timeout=None) if e.state in (RunState.DONE, RunState.FAILED)]
    return final


@pytest.mark.slow
def test_process_pool_launcher_trains_in_workers_and_reports_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = ProcessPoolLauncher(scripted_run, workers=2)  # CPU: no devices, the workers keep this environment
    try:
        assert isinstance(launcher, Launcher)
        launcher.start([*SPECS, RunSpec(label="bad", norm="boom")])
        events = _drain(launcher, 5)
    finally:
        launcher.close()
    by_label = {e.spec.label: e for e in events}
    assert sorted(by_label) == ["bad", "r0", "r1", "r2", "r3"]
    assert by_label["bad"].state is RunState.FAILED and by_label["bad"].error == "RuntimeError: no run for bad"
    assert [by_label[f"r{i}"].result.val_loss for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert {by_label[f"r{i}"].result.tokens for i in range(4)}.isdisjoint({os.getpid()})  # trained elsewhere
    assert [by_label[f"r{i}"].result.stability["visible"] for i in range(4)] == [None] * 4
    with pytest.raises(ValueError, match="workers must be >= 1"):
        ProcessPoolLauncher(scripted_run, workers=0)
    with pytest.raises(ValueError, match=r"one GPU per worker \(2\), got \['0'\]"):
        ProcessPoolLauncher(scripted_run, workers=2, devices=["0"])


def _mock_gpus(monkeypatch: pytest.MonkeyPatch, count: int, visible: str | None = None) -> None:
    """``count`` CUDA devices in this process; ``visible``: its ``CUDA_VISIBLE_DEVICES`` (None: unset)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "auto", "GPU"])
def test_a_gpu_accelerator_gives_each_worker_one_of_the_visible_gpus(
    monkeypatch: pytest.MonkeyPatch, accelerator: str
) -> None:
    _mock_gpus(monkeypatch, 4)
    assert local_workers(accelerator, None) == (4, ["0", "1", "2", "3"])  # default: one worker per GPU
    assert local_workers(accelerator, 4, devices="1") == (4, ["0", "1", "2", "3"])
    assert local_workers(accelerator, 2) == (2, ["0", "1"])
    _mock_gpus(monkeypatch, 2, visible="3,5")  # the machine's ids this process may use, not 0..n-1
    assert local_workers(accelerator, None) == (2, ["3", "5"])
    assert local_workers(accelerator, 1) == (1, ["3"])
    _mock_gpus(monkeypatch, 2, visible=" 3, 5,7")  # CUDA stops at the first id it cannot use: torch counts 2
    assert local_workers(accelerator, None) == (2, ["3", "5"])


def test_more_workers_than_gpus_or_no_gpu_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _mock_gpus(monkeypatch, 2, visible="3,5")
    with pytest.raises(UsageError, match=r"--workers 3 exceeds the 2 visible GPU\(s\) 3,5 .*'3,5'"):
        local_workers("gpu", 3)
    with pytest.raises(UsageError, match="--workers must be >= 1, got 0"):
        local_workers("gpu", 0)
    _mock_gpus(monkeypatch, 0)
    with pytest.raises(UsageError, match="--accelerator cuda but no GPU is visible"):
        local_workers("cuda", None)
    _mock_gpus(monkeypatch, 0, visible="")
    with pytest.raises(UsageError, match="--accelerator gpu but no GPU is visible .*CUDA_VISIBLE_DEVICES=''"):
        local_workers("gpu", 1)


def test_cpu_runs_and_several_devices_per_run_assign_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Today's workers: as given, default the CPUs this process may use; no device, whatever GPUs there are."""
    _mock_gpus(monkeypatch, 2)
    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert available_cpus() == 3
    assert local_workers("cpu", None) == (3, None)
    assert local_workers("cpu", 7) == (7, None)  # more workers than GPUs (or CPUs) is fine on a CPU
    assert local_workers("gpu", 7, devices=2) == (7, None)  # torchrun places each rank itself
    assert local_workers("gpu", None, devices="auto") == (3, None)
    _mock_gpus(monkeypatch, 0)
    assert local_workers("auto", None) == (3, None)  # auto without CUDA: the CPU
    with pytest.raises(UsageError, match="--workers must be >= 1, got 0"):
        local_workers("cpu", 0)


def test_a_worker_claims_a_device_no_live_worker_owns(monkeypatch: pytest.MonkeyPatch) -> None:
    """In one process, with pids made up: four workers own four devices, a fifth finds none, and a worker replacing
    a dead one takes over its device."""
    owners = multiprocessing.get_context("spawn").Array("i", 4)
    devices = ["3", "5", "8", "9"]
    alive: set[int] = set()
    monkeypatch.setattr(local, "_alive", lambda pid: pid in alive)
    claimed = []
    for pid in (101, 102, 103, 104):
        claimed.append(local._claim_device(owners, devices, pid))
        alive.add(pid)
    assert claimed == devices and list(owners) == [101, 102, 103, 104]
    with pytest.raises(RuntimeError, match="no free GPU for worker 105"):
        local._claim_device(owners, devices, 105)
    alive.discard(103)
    assert local._claim_device(owners, devices, 105) == "8" and list(owners) == [101, 102, 105, 104]


def _meeting(folder: Path, workers: int, labels: list[str]) -> list[RunSpec]:
    return [
        RunSpec(label=label, norm="rmsnorm", norm_args={"meet": str(folder), "workers": workers}) for label in labels
    ]


@pytest.mark.slow
def test_each_pool_worker_sees_its_own_gpu_also_after_a_worker_died(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two workers on the parent's visible GPUs 3 and 5 (mocked). A worker dies at its first run (having claimed
    GPU 3), failing the pool; the next four runs train on a fresh pool, each of its workers two of them on its own
    device, GPU 3 included."""
    _mock_gpus(monkeypatch, 2, visible="3,5")
    workers, devices = local_workers("gpu", None)
    launcher = ProcessPoolLauncher(scripted_run, workers, devices)
    try:
        launcher.start([RunSpec(label="dies", norm="crash")])
        [crash] = _drain(launcher, 1)
        assert crash.state is RunState.FAILED and crash.error.startswith("BrokenProcessPool: ")
        launcher.start(_meeting(tmp_path, workers, ["r0", "r1", "r2", "r3"]))
        events = _drain(launcher, 4)
    finally:
        launcher.close()
    assert all(e.state is RunState.DONE for e in events), [e.error for e in events]
    owner: dict[int, str] = {}
    for event in events:
        seen = event.result.stability
        assert seen["visible"] in devices  # one id, not a list
        assert owner.setdefault(seen["pid"], seen["visible"]) == seen["visible"]  # a worker keeps its device
    assert sorted(owner.values()) == ["3", "5"]  # two workers, each on its own device


TINY = ["--quick", "--layers", "2", "--steps", "2", "--seq-len", "32", "--batch-size", "2", "--val-batches", "4"]
TINY += ["--shuffle-buffer", "4", "--no-compile", "--seeds", "1", "--lrs", "1e-3", "3e-3", "--trajectory-every", "1"]
TINY += ["--schemes", "rmsnorm", "bhyt"]


@pytest.mark.slow
def test_a_small_study_through_the_process_pool_matches_the_inline_launcher(tmp_path: Path) -> None:
    """Same runs, same numbers: each run is seeded by its spec alone, whichever process trains it (both with one
    torch thread, as the pool's workers have). The numbers agree to float32 rounding, not bit for bit: a CPU
    matrix product may round differently in another process (its buffers aligned differently)."""
    assert main([*TINY, "--workers", "1", "--threads", "1", "--out", str(tmp_path / "inline")]) == 0
    assert main([*TINY, "--workers", "2", "--out", str(tmp_path / "pool")]) == 0
    inline, pool = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("inline", "pool"))
    assert inline["design"] == pool["design"]
    assert [r["spec"] for r in inline["runs"]] == [r["spec"] for r in pool["runs"]] and len(inline["runs"]) == 8
    for a, b in zip(inline["runs"], pool["runs"], strict=True):
        assert a["status"] == b["status"] == "ok"
        assert [v for _, v in a["losses"]] == pytest.approx([v for _, v in b["losses"]], rel=1e-5)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
        for p, q in zip(a["trajectory"], b["trajectory"], strict=True):
            assert p["step"] == q["step"]
            assert p["magnitude"] + p["variance"] == pytest.approx(q["magnitude"] + q["variance"], rel=1e-4)
    verdicts = [[t["verdict"] for t in c["tests"]] for c in inline["claims"]]
    assert verdicts == [[t["verdict"] for t in c["tests"]] for c in pool["claims"]]


def test_the_pool_reports_as_running_only_as_many_runs_as_it_has_workers() -> None:
    """A process pool marks a run running once it enters its call queue (workers + 1 of them): without a cap, a
    2-worker pool showed "5 running". Futures stand in for the pool's (no worker process is started)."""
    from concurrent.futures import Future

    launcher = ProcessPoolLauncher(scripted_run, workers=2)
    try:
        futures = [Future() for _ in range(5)]
        for future in futures:
            future.set_running_or_notify_cancel()  # all five in the call queue
        launcher._futures = dict(zip(futures, [RunSpec(label=f"q{i}", norm="rmsnorm") for i in range(5)], strict=True))
        assert [(e.spec.label, e.state) for e in launcher.poll(timeout=0)] == [
            ("q0", RunState.RUNNING),
            ("q1", RunState.RUNNING),
        ]
        futures[0].set_result(scripted_run(RunSpec(label="q0", norm="rmsnorm")))
        assert [(e.spec.label, e.state) for e in launcher.poll(timeout=0)] == [
            ("q0", RunState.DONE),
            ("q2", RunState.RUNNING),
        ]
        launcher._futures.clear()
    finally:
        launcher.close()

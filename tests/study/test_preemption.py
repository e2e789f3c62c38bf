"""A study run stopped by its job's preemption (``bhyt_pl.study.run.preemption``): it saves ``last.ckpt`` and raises
``RunPreempted``; called again it resumes at the next step and ends with the uninterrupted run's result; a
checkpoint of another spec is never resumed."""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Iterator
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from bhyt_pl.callbacks import norm_refresh
from bhyt_pl.study.cli import exploration as command
from bhyt_pl.study.launch import submitit_job
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, TrainerSettings, run_dirname
from bhyt_pl.study.run import preemption, runner
from bhyt_pl.study.run.callbacks import DivergenceMonitor
from bhyt_pl.study.run.preemption import RunCheckpointOnPreemption, RunPreempted, preemption_requested, saved_run_state
from bhyt_pl.study.run.runner import run_one

TIMING = ("train_seconds", "tokens_per_sec", "wall_seconds")
SPEC = RunSpec(
    label="bhyt@lr0.01-s0",
    norm="bhyt",
    overrides={"n_layers": 2},
    steps=8,
    lr=1e-2,
    trajectory_every=3,
    stability_every=3,
    spike_window=4,
    importance=True,
)


@pytest.fixture
def preempt_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[int], list[int]]]:
    """``(stop, steps)``: put a step in ``stop`` and the run's job is asked to stop at its end (the flag submitit's
    signal sets); ``steps`` collects the optimizer steps each fit trains."""
    stop: list[int] = []
    steps: list[int] = []

    class Recording(DivergenceMonitor):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            steps.append(trainer.global_step)
            if trainer.global_step in stop:
                preemption._PREEMPTED.set()

    monkeypatch.setattr(runner, "DivergenceMonitor", Recording)
    try:
        yield stop, steps
    finally:
        preemption._PREEMPTED.clear()


def _comparable(result: RunResult) -> str:
    """Every field but the timings, as exact text (float reprs: equal text is equal bits; NaN equals NaN)."""
    data = result.to_dict()
    for name in TIMING:
        data.pop(name)
    return json.dumps(data, sort_keys=True, default=str)


@pytest.mark.slow
def test_a_preempted_run_resumes_at_the_next_step_with_the_uninterrupted_result(
    tmp_path: Path, preempt_at: tuple[list[int], list[int]]
) -> None:
    stop, steps = preempt_at
    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    batches = setup.validation_batches()[:1]
    settings = TrainerSettings(log_every_n_steps=2)

    reference = run_one(SPEC, setup.data, batches, settings, tmp_path / "reference")
    assert reference.status == "ok", reference.error
    assert steps == list(range(1, 9))

    out, k = tmp_path / "preempted", 3  # a trajectory and a stability logging step
    run_dir = out / "runs" / run_dirname(SPEC.label)
    stop.append(k)
    steps.clear()
    with pytest.raises(RunPreempted):
        run_one(SPEC, setup.data, batches, settings, out)
    assert steps == [1, 2, 3]
    assert (run_dir / "last.ckpt").is_file() and not (run_dir / "result.json").exists()
    assert [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")] == []
    preemption._PREEMPTED.clear()  # the job's requeued process starts without the request
    assert not preemption_requested()

    steps.clear()
    resumed = run_one(SPEC, setup.data, batches, settings, out)
    assert steps == list(range(k + 1, SPEC.steps + 1))  # it went on from step k, not from the start
    assert resumed.status == "ok", resumed.error
    assert not (run_dir / "last.ckpt").exists()  # a finished run keeps only its result
    assert RunResult.from_dict(json.loads((run_dir / "result.json").read_text())).losses == resumed.losses
    for name in RunResult.__dataclass_fields__:
        if name not in TIMING:
            assert json.dumps(getattr(resumed, name), default=str) == json.dumps(
                getattr(reference, name), default=str
            ), name
    assert _comparable(resumed) == _comparable(reference)
    assert [p["step"] for p in resumed.trajectory] == [0, 3, 6, 8]
    assert [s["step"] for s in resumed.stability["steps"]] == [1, 3, 6]
    assert resumed.tokens == SPEC.steps * 2 * 32
    assert resumed.train_seconds > 0 and math.isclose(resumed.tokens_per_sec, resumed.tokens / resumed.train_seconds)


@pytest.mark.slow
def test_a_run_preempted_between_two_refreshes_of_c_ends_with_the_uninterrupted_result(
    tmp_path: Path, preempt_at: tuple[list[int], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """BHyT's c is refreshed on a schedule; the resumed run recomputed it from the weights of the preempted step,
    a value the uninterrupted run never used, and every number after that step differed."""
    stop, steps = preempt_at
    monkeypatch.setattr(norm_refresh, "default_refresh_interval", lambda max_steps: 4)  # refreshes at steps 4, 8
    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    batches = setup.validation_batches()[:1]
    spec = replace(SPEC, steps=10, trajectory_every=0, stability_every=0, importance=False)
    reference = run_one(spec, setup.data, batches, TrainerSettings(), tmp_path / "reference")
    assert reference.status == "ok", reference.error
    stop.append(6)
    with pytest.raises(RunPreempted):
        run_one(spec, setup.data, batches, TrainerSettings(), tmp_path / "preempted")
    preemption._PREEMPTED.clear()
    steps.clear()
    resumed = run_one(spec, setup.data, batches, TrainerSettings(), tmp_path / "preempted")
    assert steps == [7, 8, 9, 10] and resumed.status == "ok", resumed.error
    assert resumed.losses == reference.losses and resumed.val_loss == reference.val_loss  # exact
    assert _comparable(resumed) == _comparable(reference)


def _checkpoint(path: Path, spec: RunSpec, step: int = 3) -> dict[str, Any]:
    """A file shaped as the callback saves it (the parts ``saved_run_state`` reads)."""
    spec_data = json.loads(json.dumps(asdict(spec), default=str))
    run = {"depth_init": {"magnitude/layer_00": 1.5}, "wall_seconds": 12.5}
    state = {"spec": spec_data, "memory": {"metrics": {}}, "run": run}
    torch.save({"global_step": step, "callbacks": {RunCheckpointOnPreemption.__qualname__: state}}, path)
    return spec_data


def test_only_a_checkpoint_of_the_same_spec_is_resumed(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    spec = _checkpoint(path, SPEC)
    assert saved_run_state(path, spec) == {"depth_init": {"magnitude/layer_00": 1.5}, "wall_seconds": 12.5, "step": 3}
    assert path.is_file()
    other = json.loads(json.dumps(asdict(replace(SPEC, lr=2e-2)), default=str))
    assert saved_run_state(path, other) is None
    assert not path.exists()  # deleted: the run with the new spec starts over
    path.write_bytes(b"torn")
    assert saved_run_state(path, spec) is None and not path.exists()
    assert saved_run_state(path, spec) is None  # none there


@pytest.mark.slow
def test_a_checkpoint_of_another_spec_is_not_resumed_by_the_run(
    tmp_path: Path, preempt_at: tuple[list[int], list[int]]
) -> None:
    _, steps = preempt_at
    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    spec = replace(SPEC, steps=2, trajectory_every=0, stability_every=0, importance=False)
    run_dir = tmp_path / "runs" / run_dirname(spec.label)
    run_dir.mkdir(parents=True)
    _checkpoint(run_dir / "last.ckpt", replace(spec, steps=8), step=1)  # the same label, another spec
    result = run_one(spec, setup.data, setup.validation_batches()[:1], TrainerSettings(), tmp_path)
    assert result.status == "ok", result.error
    assert steps == [1, 2] and result.steps_done == 2 and len(result.trajectory) == 2
    assert not (run_dir / "last.ckpt").exists()
    assert result.wall_seconds < 12.5  # no earlier try's seconds added
    assert result.depth_init != {"magnitude/layer_00": 1.5}  # measured, not read from the other spec's file


# ----------------------------------------------------------------------------- SIGTERM inside a job (issue 37)
@pytest.fixture
def in_a_job() -> Iterator[list[str]]:
    """Stand-ins for the handlers a submitit job has (its preemption signal USR2 checkpoints and requeues; SIGTERM is
    bypassed), each recording its call; restored after."""
    calls: list[str] = []

    def requeue(signum, frame) -> None:
        calls.append("requeue")
        raise SystemExit(-1)

    def bypass(signum, frame) -> None:
        calls.append("bypass")

    previous = {
        signal.SIGUSR2: signal.signal(signal.SIGUSR2, requeue),
        signal.SIGTERM: signal.signal(signal.SIGTERM, bypass),
    }
    try:
        yield calls
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.mark.slow
def test_sigterm_at_a_step_saves_the_run_through_lightnings_own_sigterm_handling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_a_job: list[str]
) -> None:
    """Lightning adds its own SIGTERM handler during a fit (it ends the fit at the step's end with
    ``SIGTERMException``): the job's handler still runs, the run saves ``last.ckpt`` at the end of the step the signal
    came in and the job exits without a requeue; called again, the run goes on from the next step."""
    steps: list[int] = []

    class Signalling(DivergenceMonitor):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            steps.append(trainer.global_step)
            if trainer.global_step == 3 and not (run_dir / "last.ckpt").exists():
                os.kill(os.getpid(), signal.SIGTERM)  # SLURM's preemption, at step 3

    monkeypatch.setattr(runner, "DivergenceMonitor", Signalling)
    setup = command.prepare(["--quick", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4"])
    spec = replace(SPEC, norm="rmsnorm", label="rmsnorm@lr0.01-s0", stability_every=0, importance=False)
    run_dir = tmp_path / "runs" / run_dirname(spec.label)
    run = partial(
        run_one, datamodule_factory=setup.data, val_batches=setup.validation_batches()[:1],
        settings=TrainerSettings(), out_dir=tmp_path,
    )  # fmt: skip
    exit_code: object = "no exit"
    try:
        submitit_job.CheckpointableRun(run, grace_s=600.0)(spec)
    except SystemExit as exc:
        exit_code = exc.code
    except KeyboardInterrupt:  # Lightning's SIGTERM exit without the job's save: a failure here, not a suite's Ctrl-C
        exit_code = "KeyboardInterrupt"
    assert exit_code == submitit_job.TERMINATED_EXIT_CODE and in_a_job == []  # no requeue, nothing bypassed
    assert steps == [1, 2, 3] and (run_dir / "last.ckpt").is_file() and not (run_dir / "result.json").exists()
    assert not preemption_requested() and signal.getsignal(signal.SIGTERM).__name__ == "bypass"  # restored
    steps.clear()
    resumed = run(spec)  # the job's next try
    assert steps == list(range(4, spec.steps + 1)) and resumed.status == "ok", resumed.error

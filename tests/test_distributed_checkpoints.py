"""No checkpoint is lost in a multi-process run (gloo on CPU, each job a subprocess of the command line).

- The kill matrix: one FSDP2 run (``recipes/distributed/fsdp2-cpu.yaml``, validating every 5 steps and at the
  end) killed with SIGKILL on every rank at fixed points of a sharded save (after rank 1's shard, after
  ``.metadata``, after ``meta.pt``, between the two renames), stopped by a writer that fails on rank 1 and by
  the death of rank 1 between two saves, then at seeded random points after a save (between a save and its
  validation, during the validation; once mid-run, once after the final save); every time it resumes
  (``--ckpt_path last``) from a complete checkpoint, once from a folder without the completion marker (as
  written before it existed), and it ends with the training losses of an uninterrupted run, and the validation
  losses of every validation it completed, bit for bit. A resume after the final save trains nothing and says
  the run is complete. Every kill is struck by the job itself at its step and hook
  (``distributed_jobs.kill_points``), never at a time, so the matrix is the same on a fast idle machine and on a
  slow loaded one.
- Under DDP, a failing single-file writer on rank 0 stops every rank with one line, and the death of rank 1
  while rank 0 waits in a collective leaves one line of ours last on the survivor's stderr.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed_jobs.kill_points import AFTER_SAVE, IN_VALIDATION
from distributed_jobs.launch import ROOT, clean_env, records, val_records, write_yaml

from bhyt_pl.checkpoint_io import (
    COMPLETE,
    checkpoint_problem,
    checkpoint_step,
    kept_path,
    leftovers,
    temporary_path,
)
from bhyt_pl.runs import find_last_checkpoint

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SMALL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 48, "max_seq_len": 64}
STEPS = 20
VAL_EVERY = 5
VAL_STEPS = list(range(VAL_EVERY, STEPS + 1, VAL_EVERY))
"""The steps an uninterrupted run validates at (every ``VAL_EVERY``, and the final step)."""
SEED = 1234
STOP_WITHIN_S = 300
"""A bound against a hang, not a timing: a rank left waiting in a collective would wait out the recipes'
process-group timeout (15 min); a rank that stops on the failure is gone in seconds, on a loaded machine in
tens of seconds."""
JOB_TIMEOUT_S = 600


@dataclass
class Job:
    name: str
    returncode: int
    stdout: str
    stderr: str
    struck: float | None
    """When the test hook struck (``time.time()``), None when it did not."""
    point: str | None
    """The kill point the test hook struck at, None when it did not."""
    ended: float

    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def _job_config(tmp: Path, name: str, strategy: str, kill: dict | None, steps: int, validate: bool) -> list[str]:
    callbacks = [
        {"class_path": "recorder.StepRecorder", "init_args": {"out_dir": str(tmp / "records" / name)}},
        {"class_path": "kill_points.RecordPid", "init_args": {"out_dir": str(tmp / "pids" / name)}},
    ]
    if kill is not None:
        marker = str(tmp / f"{name}.struck")
        callbacks.append({"class_path": "kill_points.KillAt", "init_args": {"marker": marker, **kill}})
    job = {
        "trainer": {
            "max_steps": steps,
            # two batches a pass: every rank has more, so no rank waits for another's extra batch
            "limit_val_batches": 2 if validate else 0,
            "val_check_interval": VAL_EVERY,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            # in place of the recipe's depth monitor (its statistics and figures at every validation cost about 5 s
            # a job; tests/test_distributed.py runs it under FSDP2)
            "callbacks": callbacks,
        },
        "model": {"norm": "bhyt", "overrides": SMALL, "warmup_steps": 2},
        "checkpoint": {"every_n_train_steps": 1},
        "data": {"init_args": {"seq_len": 32, "batch_size": 4}},
    }
    if strategy == "ddp":
        job["trainer"] |= {"devices": 2, "strategy": "ddp"}
        stack = []
    else:
        stack = ["--config", str(ROOT / "recipes" / "distributed" / "fsdp2-cpu.yaml")]
    return ["--config", str(ROOT / "recipes" / "tiny.yaml"), *stack, "--config", write_yaml(tmp / f"{name}.yaml", job)]


def _launch(
    tmp: Path,
    name: str,
    *,
    run_name: str,
    strategy: str = "fsdp2",
    kill: dict | None = None,
    resume: bool = False,
    steps: int = STEPS,
    validate: bool = False,
) -> Job:
    """One ``python -m bhyt_pl fit`` in its own process group (so a hook can SIGKILL every rank at once)."""
    argv = [*_job_config(tmp, name, strategy, kill, steps, validate), "--runs_dir", str(tmp / "runs")]
    argv += ["--run_name", run_name, *(["--ckpt_path", "last"] if resume else [])]
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bhyt_pl", "fit", *argv], cwd=ROOT, env=clean_env(), stdout=stdout, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=JOB_TIMEOUT_S)  # a bound against a hang
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    ended = time.time()
    marker = tmp / f"{name}.struck"
    struck = json.loads(marker.read_text()) if marker.exists() else {}
    return Job(name, proc.returncode, out.read_text(), err.read_text(), struck.get("time"), struck.get("point"), ended)


def _steps(tmp: Path, name: str) -> list[int]:
    return [r["step"] for r in records(tmp / "records" / name).get(0, [])]


def _ranks_ended(tmp: Path, name: str, within: float) -> None:
    """Every rank's process has exited (pids recorded at setup); ``within`` bounds a hang."""
    deadline = time.time() + within
    for pid_file in sorted((tmp / "pids" / name).glob("pid*")):
        pid = int(pid_file.read_text())
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{pid_file.name} ({pid}) still runs")


def _checkpoints(run_dir: Path) -> Path:
    return run_dir / "version_0" / "checkpoints"


def _last_complete(run_dir: Path) -> int:
    """The step ``--ckpt_path last`` resumes, after checking the checkpoint it finds is complete."""
    found = find_last_checkpoint(run_dir)
    assert found is not None and checkpoint_problem(found) is None, (found, found and checkpoint_problem(found))
    return checkpoint_step(found)


def test_fsdp2_kill_matrix_resumes_every_time_with_the_losses_of_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = _launch(tmp_path, "reference", run_name="reference", validate=True)
    assert reference.returncode == 0, reference.stderr[-3000:]
    want_val = val_records(tmp_path / "records" / "reference")
    assert [r["step"] for r in want_val[0]] == VAL_STEPS, want_val  # every VAL_EVERY steps and the final step
    run_dir = tmp_path / "runs" / "chain"
    folder = _checkpoints(run_dir)
    jobs: list[tuple[str, Job]] = []  # (what stopped it, the job)
    states: dict[str, str] = {}  # the checkpoint folder after each job
    expected_start = 1  # the first step the next job trains
    job_index = 0

    def next_job(**kwargs) -> Job:
        nonlocal job_index
        name = f"chain{job_index}"
        left = leftovers(folder)
        job = _launch(tmp_path, name, run_name="chain", resume=job_index > 0, validate=True, **kwargs)
        states[name] = _state(folder)
        steps = _steps(tmp_path, name)
        if expected_start > STEPS:  # the previous job was stopped after the final save: the run is complete
            assert job.returncode == 0 and steps == [], (name, job.returncode, steps, job.stderr[-3000:])
            assert f"the run is complete at step {STEPS} (max_steps {STEPS}); nothing to train" in job.stdout
        else:
            assert steps and steps[0] == expected_start, (name, steps, job.stderr[-3000:])  # resumed where expected
            if left:  # the resumed run removed what the interrupted save left, and said so in one line
                assert f"removed {len(left)} leftover(s) of interrupted saves" in job.stderr, job.stderr[-2000:]
                assert not any(p.exists() for p in left if p.name != find_last_checkpoint(run_dir).name)
        job_index += 1
        return job

    def killed(point: str, step: int) -> None:
        """A job SIGKILLed on every rank at ``point`` of step ``step``; the next resumes after the last save."""
        nonlocal expected_start
        job = next_job(kill={"point": point, "step": step})
        jobs.append((f"{point}@{step}", job))
        assert job.returncode == -signal.SIGKILL and job.point == point, (point, job.returncode, job.stderr[-3000:])
        saved = step if point in AFTER_SAVE else step - 1  # a step is saved after its validation
        assert _last_complete(run_dir) == saved
        expected_start = saved + 1

    # the fixed kill points, each during the save of step k: the run resumes from step k - 1
    for point, step in (("after_rank1_shard", 2), ("after_metadata", 3), ("after_meta_pt", 4), ("between_renames", 5)):
        killed(point, step)
        assert temporary_path(folder / "last.ckpt", step).is_dir()  # the interrupted save
        if point == "between_renames":  # last.ckpt is away; its previous version waits under the kept name
            assert not (folder / "last.ckpt").exists() and kept_path(folder / "last.ckpt").is_dir()
            assert (temporary_path(folder / "last.ckpt", step) / COMPLETE).is_file()

    # a writer that fails on rank 1: every rank stops with one line, the previous checkpoint intact
    job = next_job(kill={"point": "rank1_write_fails", "step": 6})
    jobs.append(("rank1_write_fails@6", job))
    assert job.returncode == 1 and job.ended - job.struck < STOP_WITHIN_S, job.stderr[-3000:]
    _ranks_ended(tmp_path, job.name, STOP_WITHIN_S)
    errors = [line for line in job.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [job.last_line()] and "Traceback" not in job.stderr, job.stderr[-3000:]
    assert errors[0].startswith(f"error: saving {folder / 'last.ckpt'} at step 6 failed on rank 1 (OSError: ")
    assert f"the previous checkpoint {folder / 'last.ckpt'} (step 5) is intact" in errors[0]
    assert _last_complete(run_dir) == 5
    expected_start = 6

    # rank 1 dies between two saves while rank 0 works outside any collective: Lightning's process watcher sees it
    job = next_job(kill={"point": "rank1_dies", "step": 8})
    jobs.append(("rank1_dies@8", job))
    assert job.returncode == 1 and job.ended - job.struck < STOP_WITHIN_S, job.stderr[-3000:]
    assert job.last_line().startswith("error: a peer process stopped: the process of rank 1 (PID "), job.stderr[-3000:]
    assert "was killed by SIGKILL" in job.last_line() and "the last complete checkpoint is step 7 (" in job.last_line()
    assert job.last_line().endswith(f"--ckpt_path last; traceback in {run_dir / 'version_0' / 'train.log'}")
    assert _last_complete(run_dir) == 7
    expected_start = 8

    # a checkpoint written before the completion marker existed still resumes (the next job starts from it)
    (find_last_checkpoint(run_dir) / COMPLETE).unlink()
    assert _last_complete(run_dir) == 7

    # seeded random points in a validation (at its start or after its first batch, before the step's save): one
    # mid-run and one at the final step, each redone by the resumed job; then a kill in the teardown after the final
    # save: the run is complete and the last job trains nothing
    rng = random.Random(SEED)
    mid_run = [s for s in VAL_STEPS if expected_start <= s < STEPS]
    killed(rng.choice(IN_VALIDATION), rng.choice(mid_run))
    killed(rng.choice(IN_VALIDATION), STEPS)
    killed("in_teardown", STEPS)
    jobs.append(("complete", next_job()))
    assert not [p.name for p in folder.iterdir() if p.name != "last.ckpt"]  # no leftover remains
    assert checkpoint_step(folder / "last.ckpt") == STEPS

    # every step's loss, from the job that trained it last, equals the uninterrupted run's on both ranks; so does
    # every validation the chain completed
    want = records(tmp_path / "records" / "reference")
    for rank in (0, 1):
        got: dict[int, float] = {}
        got_val: dict[int, float] = {}
        for _, job in jobs:
            for record in records(tmp_path / "records" / job.name).get(rank, []):
                got[record["step"]] = record["loss"]
            for record in val_records(tmp_path / "records" / job.name).get(rank, []):
                got_val[record["step"]] = record["val_loss"]
        assert sorted(got) == list(range(1, STEPS + 1))
        assert [got[s] for s in sorted(got)] == [r["loss"] for r in want[rank]]  # bit-identical on CPU
        assert sorted(got_val) == VAL_STEPS  # a validation that a kill interrupted is redone by the resumed job
        reference_val = {r["step"]: r["val_loss"] for r in want_val[rank]}
        assert got_val == {s: reference_val[s] for s in got_val}  # bit-identical on CPU
    # the record (pytest -s): each stop, the steps its job trained, the checkpoint folder it left
    for what, job in jobs:
        steps = _steps(tmp_path, job.name)
        trained = f"{steps[0]}-{steps[-1]}" if steps else "none"
        print(f"{what:22} exit {job.returncode:3}  trained steps {trained:6}  left {states[job.name]}")


def _state(folder: Path) -> str:
    """``name(step, marker)`` of every entry of a checkpoint folder."""
    entries = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        step = checkpoint_step(path) if checkpoint_problem(path) is None else "incomplete"
        entries.append(f"{path.name}({step}{', marker' if (path / COMPLETE).is_file() else ''})")
    return " ".join(entries)


def test_ddp_a_failing_writer_on_rank_0_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    """The single-file writer raised on rank 0 while rank 1 waited in the save's barrier."""
    job = _launch(tmp_path, "ddp", run_name="ddp", strategy="ddp", steps=5, kill={"point": "rank0_io_fails", "step": 3})
    assert job.returncode == 1 and job.ended - job.struck < STOP_WITHIN_S, job.stderr[-3000:]
    _ranks_ended(tmp_path, "ddp", STOP_WITHIN_S)
    errors = [line for line in job.stderr.splitlines() if line.startswith("error: ")]
    last = tmp_path / "runs" / "ddp" / "version_0" / "checkpoints" / "last.ckpt"
    assert errors == [job.last_line()] and "Traceback" not in job.stderr, job.stderr[-3000:]
    assert errors[0].startswith(f"error: saving {last} at step 3 failed on rank 0 (OSError: [Errno 5] simulated")
    assert f"the previous checkpoint {last} (step 2) is intact" in errors[0]
    assert checkpoint_problem(last) is None and checkpoint_step(last) == 2


def test_ddp_a_dead_rank_leaves_one_line_of_ours_last_on_the_survivor(tmp_path: Path) -> None:
    """Rank 0 printed 100-160 lines of gloo tracebacks and no line of ours. Here Lightning's process watcher is
    kept from acting, so rank 0 learns of the death from its failing collective."""
    kill = {"point": "rank1_dies", "step": 3, "hold": 0.0, "watcher": False}
    job = _launch(tmp_path, "dead", run_name="dead", strategy="ddp", steps=6, kill=kill)
    assert job.returncode == 1 and job.ended - job.struck < STOP_WITHIN_S, job.stderr[-3000:]
    line = job.last_line()
    log = tmp_path / "runs" / "dead" / "version_0" / "train.log"
    assert line.startswith("error: a peer process stopped: gloo lost its connection to 127.0.0.1:"), job.stderr[-3000:]
    assert "the last complete checkpoint is step 2 (" in line and line.endswith(f"; traceback in {log}")
    assert "Traceback" not in job.stderr and "gloo/transport/tcp/pair.cc" in log.read_text()  # the traceback

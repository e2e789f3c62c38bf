"""``HangWatchdog``: SIGTERM or Ctrl-C ends a run whose main thread waits in a collective that a stopped peer never
joins. Its timing rule and its line are checked without processes (a fake clock, a fake trainer); a real signal
reaches it through the wakeup fd in this process, chained to an earlier owner of that fd, and inside a real fit;
and a two-process DDP run with rank 1 frozen by SIGSTOP ends on SIGTERM (143), then resumes with the command its
line printed and ends on Ctrl-C (130)."""

from __future__ import annotations

import os
import pickle
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import yaml
from lightning.pytorch.demos.boring_classes import BoringModel

from bhyt_pl.callbacks.run_log import RunLogFile
from bhyt_pl.checkpoint_io import AtomicCheckpointIO
from bhyt_pl.failures import FailureReport, python_command
from bhyt_pl.watchdog import HangWatchdog, Progress, describe_progress

ROOT = Path(__file__).resolve().parents[1]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_is_grace_after_the_later_of_the_signal_and_the_last_progress() -> None:
    watchdog = HangWatchdog(grace_s=60)
    clock = watchdog._clock = _Clock()
    watchdog._progressed("training", 4, 3, started=True)  # at 100
    assert watchdog.deadline() is None  # no signal, no deadline
    clock.now = 130.0
    watchdog._signalled(signal.SIGTERM)
    assert watchdog.deadline() == 190.0  # the progress at 100 came before the signal
    clock.now = 150.0
    watchdog._progressed("training", 4, 3, started=False)  # the normal path goes on: the step ended
    assert watchdog.deadline() == 210.0
    clock.now = 160.0
    watchdog._signalled(signal.SIGINT)  # a second signal does not restart the count
    assert watchdog.deadline() == 210.0 and watchdog._signal == (signal.SIGTERM, 130.0)


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        (None, "the run had not started a batch yet"),
        (Progress("training", 4, 3, True, 0.0), "training step 4 (batch 3) had started"),
        (Progress("training", 4, 3, False, 0.0), "training step 4 (batch 3) had ended"),
        (Progress("save", 4, None, True, 0.0), "the save of the checkpoint of step 4 had started"),
        (Progress("validation", 50, 2, True, 0.0), "validation batch 2 (at training step 50) had started"),
    ],
)
def test_where_progress_stopped_is_said_in_a_few_words(progress, expected) -> None:
    assert describe_progress(progress) == expected


def test_the_hooks_record_the_step_each_batch_belongs_to() -> None:
    """A batch starts with ``global_step`` counting the finished steps; it ends with its own step counted, unless
    gradients accumulate and the step goes on."""
    watchdog = HangWatchdog()
    trainer = SimpleNamespace(global_step=3, accumulate_grad_batches=2, sanity_checking=False)
    watchdog.on_train_batch_start(trainer, None, None, batch_idx=6)
    assert describe_progress(watchdog._progress) == "training step 4 (batch 6) had started"
    watchdog.on_train_batch_end(trainer, None, None, None, batch_idx=6)  # mid-accumulation: step 4 goes on
    assert describe_progress(watchdog._progress) == "training step 4 (batch 6) had ended"
    trainer.global_step = 4
    watchdog.on_train_batch_end(trainer, None, None, None, batch_idx=7)
    assert describe_progress(watchdog._progress) == "training step 4 (batch 7) had ended"
    watchdog.on_save_checkpoint(trainer, None, {})
    assert describe_progress(watchdog._progress) == "the save of the checkpoint of step 4 had started"


def test_the_line_names_the_wait_the_killed_ranks_the_checkpoint_and_the_resume_command(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    AtomicCheckpointIO().save_checkpoint({"global_step": 7}, checkpoints / "last.ckpt")
    log = RunLogFile()
    log.path = tmp_path / "train.log"
    log.path.write_text("")
    trainer = SimpleNamespace(world_size=2, checkpoint_callback=SimpleNamespace(dirpath=str(checkpoints)),
                              callbacks=[log])  # fmt: skip
    report = FailureReport(["fit", "--config", "recipes/tiny.yaml"])
    report.trainer = trainer
    watchdog = HangWatchdog(grace_s=60)
    watchdog._trainer = trainer
    watchdog._progress = Progress("training", 8, 7, False, 0.0)

    def frame() -> object:
        return sys._getframe()

    launched = [(1, SimpleNamespace(pid=4243)), (2, SimpleNamespace(pid=4244))]
    line = watchdog.hang_line(report, signal.SIGTERM, frame(), launched)
    assert line == (
        f"stopped by SIGTERM: no progress for 60 s after the signal: training step 8 (batch 7) had ended and a "
        f"collective with the peer processes did not return (a peer stopped or hangs); the main thread waits in "
        f"frame ({'/'.join(Path(__file__).parts[-3:])}:{frame.__code__.co_firstlineno + 1}); killed the ranks this "
        f"process launched: rank 1 (PID 4243), rank 2 (PID 4244); the last complete checkpoint is step 7 "
        f"({checkpoints / 'last.ckpt'}); resume with the same launcher and: {python_command()} -m bhyt_pl fit --config "
        f"recipes/tiny.yaml --ckpt_path last; every thread's stack in {log.path}"
    )
    trainer.world_size = 1
    own = FailureReport(None)  # a Trainer of your own: no command line to repeat
    own.trainer = trainer
    alone = watchdog.hang_line(own, signal.SIGINT, None, [])
    assert alone.startswith("stopped by Ctrl-C: no progress for 60 s after the signal: training step 8 (batch 7) "
                            "had ended and it did not finish; the last complete checkpoint is step 7 (")  # fmt: skip
    assert alone.endswith(f"; resume from it with Trainer.fit(ckpt_path=...); every thread's stack in {log.path}")


def test_a_spawned_process_gets_the_setting_not_the_thread(signals_restored) -> None:
    """``ddp_spawn`` pickles the trainer with its callbacks: a lock, a thread and a pipe do not pickle."""
    watchdog = HangWatchdog(grace_s=30)
    watchdog.failure_report = FailureReport(["fit"])
    watchdog.setup(SimpleNamespace(), None, "fit")
    try:
        copy = pickle.loads(pickle.dumps(watchdog))
    finally:
        watchdog.teardown(SimpleNamespace(), None, "fit")
    assert (copy.grace_s, copy.failure_report, copy._thread, copy.deadline()) == (30.0, None, None, None)


@pytest.mark.parametrize("grace_s", [0, -5, True])
def test_the_grace_must_be_a_positive_number_of_seconds(grace_s) -> None:
    with pytest.raises(ValueError, match=re.escape(f"HangWatchdog: grace_s must be a positive number of seconds or "
                                                   f"None (off), got {grace_s!r}")):  # fmt: skip
        HangWatchdog(grace_s=grace_s)
    assert HangWatchdog(grace_s=None).grace_s is None


def test_the_command_line_adds_it_with_its_knob(monkeypatch, capsys) -> None:
    from bhyt_pl.cli import main

    monkeypatch.setattr(sys, "argv", ["bhyt_pl"])
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--hang_watchdog.grace_s", "30",
              "--print_config"])  # fmt: skip
    assert yaml.safe_load(capsys.readouterr().out)["hang_watchdog"] == {"grace_s": 30.0}


@pytest.fixture
def signals_restored():
    """The wakeup fd and SIGTERM's handler as they were."""
    handler = signal.getsignal(signal.SIGTERM)
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    signal.signal(signal.SIGTERM, handler)
    signal.set_wakeup_fd(wakeup)


def test_a_signal_reaches_the_thread_and_the_earlier_wakeup_fd(monkeypatch, signals_restored) -> None:
    """The thread acts only while the main thread is inside the run; after the run (a notebook goes on) a signal
    is forgotten. The wakeup fd installed before it (asyncio's) still gets every signal number."""
    earlier_read, earlier_write = os.pipe()
    os.set_blocking(earlier_write, False)
    signal.set_wakeup_fd(earlier_write)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a Python handler, as Lightning's
    watchdog = HangWatchdog(grace_s=0.01)
    in_run = [None, "the main thread's frame"]  # first: the run is over; then: still in it
    checked, ended = threading.Event(), threading.Event()
    raised: list[int] = []
    ends: list[tuple[object, int]] = []

    def main_frame_in_run() -> object:
        checked.set()
        return in_run.pop(0)

    def end_run(frame: object) -> None:
        ends.append((frame, len(raised)))
        ended.set()

    monkeypatch.setattr(watchdog, "main_frame_in_run", main_frame_in_run)
    monkeypatch.setattr(watchdog, "end_run", end_run)
    watchdog.setup(SimpleNamespace(), None, "fit")
    try:
        raised.append(1)
        signal.raise_signal(signal.SIGTERM)
        assert select.select([earlier_read], [], [], 60)[0] and os.read(earlier_read, 16) == bytes([signal.SIGTERM])
        assert checked.wait(60)
        raised.append(2)
        signal.raise_signal(signal.SIGTERM)
        assert ended.wait(60)
        assert ends == [("the main thread's frame", 2)]  # the first signal was forgotten, not acted on
        assert watchdog._thread is not None and watchdog._thread.join(60) is None and not watchdog._thread.is_alive()
    finally:
        watchdog.teardown(SimpleNamespace(), None, "fit")
    assert signal.set_wakeup_fd(-1) == earlier_write  # the earlier fd is back in place
    os.close(earlier_read)
    os.close(earlier_write)


class _HangsAfterSigterm(L.Callback):
    """At the end of step ``step`` it sends this process SIGTERM and waits (as in a collective) until released."""

    def __init__(self, step: int) -> None:
        self.step, self.released = step, threading.Event()

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
            assert self.released.wait(120), "the watchdog did not act"


def test_in_a_fit_a_hang_after_sigterm_reaches_the_end_of_the_run(tmp_path: Path, monkeypatch, signals_restored):
    """Lightning's SIGTERM handler ran (the wait here is interruptible, unlike a collective) but the run made no
    progress: the watchdog found the main thread inside ``fit`` and would end the run."""
    hang = _HangsAfterSigterm(step=2)
    watchdog = HangWatchdog(grace_s=0.05)
    lines: list[str] = []
    frames: list[tuple[str, str]] = []

    def end_run(frame) -> None:
        lines.append(watchdog.hang_line(FailureReport(None), signal.SIGTERM, frame, []))
        while frame is not None:  # (type of ``self``, function) of each frame, innermost first
            frames.append((type(frame.f_locals.get("self")).__name__, frame.f_code.co_name))
            frame = frame.f_back
        hang.released.set()

    monkeypatch.setattr(watchdog, "end_run", end_run)
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=5, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[hang, watchdog])  # fmt: skip
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException, after the released step
        trainer.fit(BoringModel())
    assert watchdog._thread is not None  # after a signal it stays to the end of the process
    watchdog.teardown(trainer, None, "fit")  # Lightning calls no teardown hook after an exception
    assert lines and lines[0].startswith(
        "stopped by SIGTERM: no progress for 0.05 s after the signal: training step 2 (batch 1) had started and it "
        "did not finish; the main thread waits in "
    ), lines
    assert ("_HangsAfterSigterm", "on_train_batch_end") in frames and ("Trainer", "fit") in frames  # in the run
    assert lines[0].endswith("; no checkpoint was saved yet") and trainer.global_step == 2
    assert watchdog.main_frame_in_run() is None  # the run is over


class _Fails(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        raise RuntimeError("a bug")


def test_a_run_that_fails_on_its_own_leaves_no_watchdog_behind(tmp_path: Path, signals_restored) -> None:
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    watchdog = HangWatchdog()
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=5, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[_Fails(), watchdog])  # fmt: skip
    with pytest.raises(RuntimeError, match="a bug"):
        trainer.fit(BoringModel())
    assert watchdog._thread is None and signal.set_wakeup_fd(wakeup) == wakeup


# ---------------------------------------------------------------------------------------------- two processes
def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _hung_run(tmp: Path, command: list[str], signum: int) -> tuple[int, list[str], float, int, int]:
    """Run ``command`` until rank 1 froze itself, send ``signum`` to rank 0 (the launcher) and wait for the end:
    exit status, the console's non-empty lines, seconds from the signal to the exit, the two PIDs."""
    from distributed_jobs.launch import clean_env

    marker = tmp / "stopped"
    marker.unlink(missing_ok=True)
    console = tmp / f"console.{signum}"
    with open(console, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=clean_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        stopped_pid = None
        try:
            deadline = time.monotonic() + 600  # a bound on a broken run, not a timing
            while proc.poll() is None and time.monotonic() < deadline and not marker.exists():
                time.sleep(0.1)
            assert marker.exists(), console.read_text()[-3000:]
            stopped_pid = int(marker.read_text())
            while not _stopped(stopped_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            signalled = time.monotonic()
            proc.send_signal(signum)
            returncode = proc.wait(timeout=600)
            elapsed = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            if stopped_pid is not None and not _gone(stopped_pid):
                os.kill(stopped_pid, signal.SIGKILL)
    lines = [line for line in console.read_text().splitlines() if line.strip()]
    return returncode, lines, elapsed, proc.pid, stopped_pid


@pytest.mark.slow
@pytest.mark.distributed
def test_a_ddp_run_with_a_frozen_peer_ends_on_sigterm_and_on_ctrl_c(tmp_path: Path) -> None:
    """Only SIGKILL ended such a run: SIGTERM and Ctrl-C were left to handlers that never ran, and the processes
    held their devices until the process-group timeout."""
    from distributed_jobs.launch import write_yaml

    job = {"trainer": {"devices": 2, "strategy": "ddp", "max_steps": 8, "limit_val_batches": 0,
                       "enable_progress_bar": False, "enable_model_summary": False,
                       "callbacks+": [{"class_path": "signals.StopRankAt",
                                       "init_args": {"marker": str(tmp_path / "stopped"), "steps": 3}}]},
           "model": {"overrides": {"dim": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 48}},
           "data": {"init_args": {"seq_len": 16, "batch_size": 2}}, "checkpoint": {"every_n_train_steps": 1},
           "hang_watchdog": {"grace_s": 5}}  # fmt: skip
    argv = ["fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--config", write_yaml(tmp_path / "job.yaml", job),
            "--runs_dir", str(tmp_path / "runs"), "--run_name", "hang"]  # fmt: skip
    version = tmp_path / "runs" / "hang" / "version_0"
    last, log = version / "checkpoints" / "last.ckpt", version / "train.log"
    pattern = (
        r"error: stopped by {signal}: no progress for 5 s after the signal: training step {step} \(batch {batch}\) "
        r"had (started|ended) and a collective with the peer processes did not return \(a peer stopped or hangs\); "
        r"the main thread waits in \w+ \(.+:\d+\); killed the rank this process launched: rank 1 \(PID {pid}\); "
        r"the last complete checkpoint is step {saved} \({last}\); resume with the same launcher and: "
        r"(?P<command>\S+ -m bhyt_pl .+ --ckpt_path last); every thread's stack in {log}"
    )

    code, lines, elapsed, launcher, peer = _hung_run(tmp_path, [sys.executable, "-m", "bhyt_pl", *argv],
                                                     signal.SIGTERM)  # fmt: skip
    print(f"SIGTERM: exit {code} after {elapsed:.1f} s; last line: {lines[-1]}")
    assert code == 143 and elapsed < 120, lines[-20:]  # the promise: gone within 2 minutes of the signal
    assert _gone(launcher) and _gone(peer)
    found = re.fullmatch(pattern.format(signal="SIGTERM", step=3, batch=2, pid=peer, saved=2, last=re.escape(str(last)),
                                        log=re.escape(str(log))), lines[-1])  # fmt: skip
    assert found is not None and sum("error: " in line for line in lines) == 1, lines[-20:]
    assert "the stack of every thread" in log.read_text()

    resume = shlex.split(found.group("command"))  # the printed command resumes: from step 2, frozen at step 5
    assert resume[1:3] == ["-m", "bhyt_pl"] and os.path.samefile(resume[0], sys.executable)
    code, lines, elapsed, launcher, peer = _hung_run(tmp_path, [sys.executable, *resume[1:]], signal.SIGINT)
    print(f"Ctrl-C: exit {code} after {elapsed:.1f} s; last line: {lines[-1]}")
    assert code == 130 and elapsed < 120, lines[-20:]
    assert _gone(launcher) and _gone(peer)
    expected = pattern.format(signal="Ctrl-C", step=5, batch=r"\d+", pid=peer, saved=4, last=re.escape(str(last)),
                              log=re.escape(str(log)))  # fmt: skip
    assert re.fullmatch(expected, lines[-1]) and sum("error: " in line for line in lines) == 1, lines[-20:]

"""The one-line reports of a failed run: what gloo and NCCL errors say about a lost peer (messages as torch 2.13
prints them on this machine), the resume command, and Lightning's process watcher reporting a stopped rank
instead of killing rank 0 (driven here with real child processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.callbacks.run_log import RunLogFile
from bhyt_pl.failures import FailureReport, peer_failure, python_command, resume_command

GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:6047. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF! 🏖️"
)
GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:33190: "
    "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError(GLOO_CLOSED), "gloo lost its connection to 127.0.0.1:6047 (gloo names the address of a peer, "
                                    "not its rank)"),
        (RuntimeError(GLOO_RESET), "gloo lost its connection to 127.0.0.1:33190 (gloo names the address of a peer, "
                                   "not its rank)"),
        (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or "
                                            "there was a network error, NCCL version 2.21.5"),
         "NCCL reports that a remote process exited or the network failed"),
        (torch.distributed.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: "
                                            "WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 900000 milliseconds"),
         "a collective timed out: a peer process hung or stopped (the recipe's process-group timeout)"),
        (ConnectionResetError(104, "Connection reset by peer"), None),  # a download, not a peer
        (RuntimeError("CUDA out of memory"), None),
    ],
    ids=["gloo-closed", "gloo-reset", "nccl-exit", "nccl-timeout", "socket", "other"],
)  # fmt: skip
def test_what_an_error_says_about_a_lost_peer(error: BaseException, expected: str | None) -> None:
    assert peer_failure(error) == expected


def test_a_lost_peer_is_found_inside_chained_and_checkpoint_errors() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = RuntimeError("Trainer.fit failed")
    wrapped.__cause__ = CheckpointException("write", {1: (RuntimeError(GLOO_CLOSED), None)})
    assert peer_failure(wrapped).startswith("gloo lost its connection to 127.0.0.1:6047")


def test_the_resume_command_repeats_the_arguments_with_ckpt_path_last(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    argv = ["fit", "--config", "recipes/tiny.yaml", "--ckpt_path", "runs/x/last.ckpt", "--model.norm_args",
            "{lambda_attn: 1.0}", "--ckpt_path=other"]  # fmt: skip
    assert resume_command(argv) == (
        ".venv/bin/python -m bhyt_pl fit --config recipes/tiny.yaml --model.norm_args '{lambda_attn: 1.0}' "
        "--ckpt_path last"
    )


def test_the_resume_command_names_the_interpreter_that_runs(tmp_path: Path, monkeypatch) -> None:
    """A bare ``python`` after the quick start is the system's, without torch: the line names the one that ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("")
    (bin_dir / "python").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert python_command() == "python"  # the python on PATH
    monkeypatch.setattr(sys, "executable", "/opt/elsewhere/bin/python3")
    assert python_command() == "/opt/elsewhere/bin/python3"  # neither on PATH nor below the working directory


def _trainer(tmp_path: Path, step: int | None, interrupted: bool = False) -> SimpleNamespace:
    """What the report reads of a trainer: its checkpoint folder, its log file, and whether it is stopping."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    if step is not None:
        from bhyt_pl.checkpoint_io import AtomicCheckpointIO

        AtomicCheckpointIO().save_checkpoint({"global_step": step}, checkpoints / "last.ckpt")
    log = RunLogFile()
    log.path = tmp_path / "train.log"
    log.path.write_text("")
    return SimpleNamespace(
        checkpoint_callback=SimpleNamespace(dirpath=str(checkpoints)), callbacks=[log], interrupted=interrupted,
        progress_bar_callback=None, node_rank=0, num_devices=2,
    )  # fmt: skip


def test_the_peer_line_names_the_last_complete_checkpoint_the_command_and_the_log(tmp_path: Path) -> None:
    report = FailureReport(["fit", "--config", "recipes/tiny.yaml"])
    report.trainer = _trainer(tmp_path, step=7)
    (tmp_path / "checkpoints" / ".last.ckpt.step8.tmp").mkdir()  # an interrupted save is not complete
    assert report.peer_line("gloo lost its connection to 127.0.0.1:6047") == (
        f"a peer process stopped: gloo lost its connection to 127.0.0.1:6047; the last complete checkpoint is "
        f"step 7 ({tmp_path / 'checkpoints' / 'last.ckpt'}); resume with the same launcher and: "
        f"{python_command()} -m bhyt_pl fit --config recipes/tiny.yaml --ckpt_path last; "
        f"traceback in {tmp_path / 'train.log'}"
    )
    (tmp_path / "fresh").mkdir()
    report.trainer = _trainer(tmp_path / "fresh", step=None)
    assert f"; no checkpoint was saved yet: start again with the same launcher and: {python_command()} -m bhyt_pl " \
           "fit --config recipes/tiny.yaml;" in report.peer_line("x")  # fmt: skip


class _Exited(Exception):
    pass


def _dead_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    child.wait()
    return child


def test_lightnings_watcher_reports_a_killed_rank_in_one_line_and_exits_1(tmp_path: Path, monkeypatch, capsys) -> None:
    """It logged "Child process ... terminated with code -9. Forcefully terminating all other processes" and
    killed rank 0 with SIGKILL (exit 137): no line of ours, and a status that says killed, not failed."""
    report = FailureReport(["fit", "--config", "recipes/tiny.yaml"])
    report.trainer = _trainer(tmp_path, step=4)
    exits: list[int] = []

    def exit_now(code: int) -> None:  # os._exit would end pytest
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(report, "exit_now", exit_now)
    # ``alive`` runs until it is killed (or this process ends: its stdin closes), whatever the machine's speed
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead = _dead_child()
    observer = SimpleNamespace(_child_processes=[alive, dead])
    original = []
    with pytest.raises(_Exited):
        report._poll(observer, original.append)
    assert exits == [1] and original == []  # not Lightning's kill
    assert alive.wait(timeout=10) == -9  # the other launched ranks are killed, as Lightning does
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: a peer process stopped: the process of rank 2 (PID {dead.pid}) was killed by "
                           f"SIGKILL; the last complete checkpoint is step 4 (")  # fmt: skip
    assert (tmp_path / "train.log").read_text().strip() == line  # the log file has it too


def test_the_watcher_lets_a_stopping_rank_0_report_first(tmp_path: Path, monkeypatch) -> None:
    """Rank 0 already stops on its own exception (a failed save, a broken collective): its line comes first;
    Lightning's kill remains the fallback should that shutdown hang."""
    from bhyt_pl import failures

    report = FailureReport(["fit"])
    report.trainer = _trainer(tmp_path, step=4, interrupted=True)
    observer = SimpleNamespace(_child_processes=[_dead_child()])
    calls: list[object] = []
    assert report._poll(observer, calls.append) is False and calls == []
    monkeypatch.setattr(failures, "_WATCH_GRACE_S", 0.0)
    report._poll(observer, calls.append)
    assert calls == [observer]


def test_a_watcher_with_every_rank_finished_stops_watching(tmp_path: Path) -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    report = FailureReport(["fit"])
    assert report._poll(SimpleNamespace(_child_processes=[finished]), lambda observer: None) is True


def test_a_run_of_your_own_names_the_checkpoint_to_resume_from(tmp_path: Path) -> None:
    report = FailureReport(None)  # not the command line: no command to repeat
    report.trainer = _trainer(tmp_path, step=5)
    last = tmp_path / "checkpoints" / "last.ckpt"
    hint = f"the last complete checkpoint is step 5 ({last}); resume from it with Trainer.fit(ckpt_path=...)"
    assert report.resume_hint() == hint
    (tmp_path / "fresh").mkdir()
    report.trainer = _trainer(tmp_path / "fresh", step=None)
    assert report.resume_hint() == "no checkpoint was saved yet"


def test_a_line_the_log_cannot_take_still_reaches_the_console(tmp_path: Path, monkeypatch, capsys) -> None:
    """The log may sit on the disk that is full."""
    import errno

    from bhyt_pl import failures

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    report = FailureReport(["fit"])
    report.trainer = _trainer(tmp_path, step=None)
    monkeypatch.setattr(failures, "open", full_disk, raising=False)  # the module's own name for the built-in
    report.print_line("the disk is full")
    assert capsys.readouterr().err == "error: the disk is full\n"


def test_the_thread_that_ends_the_process_prints_last_and_its_status_stands() -> None:
    """The hang watchdog ends the process from its own thread while the main thread, woken by the killed peers,
    prints and reports on its own: its output after the line is dropped, and its exit waits."""
    script = (
        "import sys, threading\n"
        "from bhyt_pl.failures import FailureReport\n"
        "report = FailureReport(['fit'])\n"
        "inside, done = threading.Event(), threading.Event()\n"
        "def kill_peers():\n"
        "    inside.set()\n"
        "    done.wait(60)\n"
        "threading.Thread(target=report.end_process, args=('the run hung', 143, kill_peers)).start()\n"
        "assert inside.wait(60)\n"
        "sys.stderr.write('Received SIGTERM\\n')\n"
        "sys.stderr.flush()\n"
        "done.set()\n"
        "report.exit_now(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr, proc.stdout) == (143, "error: the run hung\n", "")

"""How the command line reports a training run that stops on an error it can explain: one line, last on the
console, instead of a wall of tracebacks.

- A peer process of a multi-process run stopped (killed, crashed, out of memory). The survivors' collective
  fails: gloo names the peer's address and port, not its rank; NCCL says a remote process exited; a hung peer
  shows as a collective timeout. Or Lightning's watcher of the processes it launched (rank 0 launches ranks
  1..N-1 on its node) sees one of them end: it would log a line of its own and kill rank 0 with SIGKILL, so
  while the command line trains, ``FailureReport.watching_launched_processes`` has it report and exit 1 instead.
- A checkpoint save failed (``CheckpointSaveError``, raised on every rank after the same save): rank 0 says so.
- A signal could not stop a run hung in a collective: ``bhyt_pl.watchdog.HangWatchdog`` ends it from its own
  thread (``end_process``).

Each line names what is known, the step of the last complete checkpoint and the command that resumes, and
points to the run's ``train.log`` (``RunLogFile``), which holds the traceback.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import lightning as L

from bhyt_pl.callbacks.checkpointing import CheckpointSaveError
from bhyt_pl.callbacks.run_log import RunLogFile
from bhyt_pl.checkpoint_io import complete_checkpoints
from bhyt_pl.errors import exception_chain
from bhyt_pl.interpreter import python_command

__all__ = ["FailureReport", "Report", "exception_chain", "peer_failure", "python_command", "resume_command"]

_GLOO_PEER = re.compile(r"Connection (?:closed|reset) by peer|Read error|Write error|Connection refused")
_ADDRESS = re.compile(r"\[(?P<address>[^\]]+)\]:(?P<port>\d+)")
"""gloo's ``[127.0.0.1]:6047`` (its own source location ``[.../pair.cc:553]`` has no port after it)."""
_STORE_LOST = re.compile(r"Connection reset by peer|Broken pipe|Connection refused|recvValue failed|failed to recv")
_WATCH_GRACE_S = 20.0
"""How long Lightning's process watcher waits for this process to finish reporting its own exception before
it falls back to Lightning's kill (a shutdown that hangs in a collective)."""


class Report(NamedTuple):
    """What the command line prints for a failure it explains."""

    line: str
    exit_code: int
    every_rank: bool
    """Print on every rank (a peer stopped: any rank may be the survivor) or on rank 0 only."""


def peer_failure(err: BaseException) -> str | None:
    """What an exception says about a lost peer process, in a few words, or None when it is about something else.

    Example:
        >>> peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:6047. This is typically"))
        'gloo lost its connection to 127.0.0.1:6047 (gloo names the address of a peer, not its rank)'
    """
    import torch.distributed as dist

    for exc in exception_chain(err):
        text = " ".join(str(exc).split())
        if ("gloo" in text or "pair.cc" in text) and _GLOO_PEER.search(text):
            address = _ADDRESS.search(text)
            if address is not None:
                return (
                    f"gloo lost its connection to {address.group('address')}:{address.group('port')} "
                    f"(gloo names the address of a peer, not its rank)"
                )
            return "gloo lost its connection to a peer"
        distributed = isinstance(exc, dist.DistError) or any(k in text for k in ("NCCL", "c10d", "ProcessGroup"))
        if not distributed:
            continue
        if "remote process exited" in text or "network error" in text:
            return "NCCL reports that a remote process exited or the network failed"
        if "Watchdog caught collective operation timeout" in text or "timed out" in text.lower():
            return "a collective timed out: a peer process hung or stopped (the recipe's process-group timeout)"
        if _STORE_LOST.search(text):
            return "the connection to rank 0's rendezvous store was lost (rank 0 stopped)"
    return None


def resume_command(argv: list[str]) -> str:
    """The command line that resumes ``python -m bhyt_pl <argv>`` from its last checkpoint, with this interpreter."""
    args: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            args.append(arg)
    return shlex.join([python_command(), "-m", "bhyt_pl", *args, "--ckpt_path", "last"])


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class FailureReport:
    """The one-line reports of a command-line run (module docstring); the CLI gives it the trainer once built.

    ``argv`` is the command line's (``python -m bhyt_pl <argv>``), None for a run of your own ``Trainer`` (its
    lines then name the checkpoint to resume from instead of a command)."""

    def __init__(self, argv: list[str] | None) -> None:
        self.argv = None if argv is None else list(argv)
        self.trainer: L.Trainer | None = None
        self._lock = threading.Lock()
        self._exit_lock = threading.Lock()
        """Held by the thread that ends the process: a report from another thread then waits instead of exiting
        with its own status (``end_process``)."""
        self._printed = False
        self._stopping_since: float | None = None

    def explain(self, err: BaseException) -> Report | None:
        """The report for ``err``, None when this module does not explain it (its traceback is printed)."""
        detail = peer_failure(err)
        if detail is not None:
            return Report(self.peer_line(detail), 1, every_rank=True)
        for exc in exception_chain(err):
            if isinstance(exc, CheckpointSaveError):
                return Report(f"{exc}; fix the cause and resume with --ckpt_path last{self._log_hint()}", 1, False)
        return None

    def report_and_exit(self, err: BaseException) -> None:
        """On the command line, for an exception that stopped a run: print the report's one line (every rank
        for a stopped peer, rank 0 for a failed save) and exit; for any other exception print its traceback and
        where ``train.log`` is, and exit 1. Returns (to let the exception go on) only when the run has no log."""
        from lightning.pytorch.utilities import rank_zero_only

        explained = self.explain(err)
        if explained is not None:
            if explained.every_rank or rank_zero_only.rank == 0:
                self.print_line(explained.line)
            if explained.every_rank:  # a peer stopped: nothing is left to save, and the process group's
                self.exit_now(explained.exit_code)  # teardown waits seconds on the dead peer's connections
            raise SystemExit(explained.exit_code) from None
        log_file = self.log_file()
        if log_file is None:
            return
        traceback.print_exception(err)
        self.print_line(f"the run stopped on the {type(err).__name__} above; traceback and log in {log_file}")
        raise SystemExit(1) from None

    def peer_line(self, detail: str) -> str:
        return f"a peer process stopped: {detail}; {self.resume_hint()}{self._log_hint()}"

    def resume_hint(self) -> str:
        """Where a stopped run goes on from: the last complete checkpoint and the command that resumes from it
        (the command that starts again when none was saved)."""
        last = self.last_complete()
        if last is None:
            if self.argv is None:
                return "no checkpoint was saved yet"
            command = shlex.join([python_command(), "-m", "bhyt_pl", *self.argv])
            return f"no checkpoint was saved yet: start again with the same launcher and: {command}"
        step = "" if last[1] is None else f"step {last[1]} "
        if self.argv is None:
            return f"the last complete checkpoint is {step}({last[0]}); resume from it with Trainer.fit(ckpt_path=...)"
        return (
            f"the last complete checkpoint is {step}({last[0]}); resume with the same launcher and: "
            f"{resume_command(self.argv)}"
        )

    def last_complete(self) -> tuple[Path, int | None] | None:
        """The newest complete checkpoint of this run (None when none was saved, or before the trainer exists)."""
        callback = self.trainer.checkpoint_callback if self.trainer is not None else None
        dirpath = getattr(callback, "dirpath", None)
        if not dirpath or "://" in str(dirpath):
            return None
        found = complete_checkpoints(dirpath)
        return found[0] if found else None

    def log_file(self) -> Path | None:
        """This rank's ``train.log`` when the run has one."""
        for callback in self.trainer.callbacks if self.trainer is not None else []:
            if isinstance(callback, RunLogFile) and callback.path is not None and callback.path.is_file():
                return callback.path
        return None

    def _log_hint(self) -> str:
        path = self.log_file()
        return f"; traceback in {path}" if path is not None else ""

    def print_line(self, line: str) -> None:
        """Print ``error: <line>`` on stderr once (from any thread), and append it to this rank's log file."""
        with self._lock:
            if self._printed:
                return
            self._printed = True
            self.console_ready()
            sys.stderr.write(f"error: {line}\n")
            sys.stderr.flush()
            path = self.log_file()
            if path is not None:
                try:
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(f"error: {line}\n")
                except OSError:  # the console has it; the log's disk may be the full one
                    pass

    def exit_now(self, code: int) -> NoReturn:
        """End the process at once with ``code``, after flushing the console and the log files. When another
        thread is already ending the process (``end_process``), wait for it: its status stands."""
        self._exit_lock.acquire()
        self._exit(code)

    def end_process(self, line: str, code: int, before_exit: Callable[[], None] = lambda: None) -> NoReturn:
        """From any thread: print ``line`` (``print_line``), run ``before_exit`` (killing the processes this one
        launched) and end the process with ``code``. Reports that other threads start meanwhile (a peer's death
        seen by Lightning's process watcher, the main thread's own exception) wait rather than exit first."""
        self._exit_lock.acquire()
        self.print_line(line)
        # the line stays last: the main thread, woken by ``before_exit`` (its collective fails once the peers are
        # killed), would otherwise print on (Lightning's signal handler logs "Received SIGTERM") until ``_exit``
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        for console in (1, 2):  # the process's own stdout and stderr, whatever sys.stdout has become
            os.dup2(devnull, console)
        before_exit()
        self._exit(code)

    def _exit(self, code: int) -> NoReturn:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def console_ready(self) -> None:
        """End an open progress bar's line, so that what follows starts a line of its own."""
        from lightning.pytorch.callbacks import TQDMProgressBar

        bar = self.trainer.progress_bar_callback if self.trainer is not None else None
        if not isinstance(bar, TQDMProgressBar):
            return
        for name in ("train_progress_bar", "val_progress_bar", "test_progress_bar", "predict_progress_bar"):
            try:
                getattr(bar, name).close()
            except (TypeError, AttributeError):  # that bar was never created
                pass

    @contextmanager
    def watching_launched_processes(self) -> Iterator[None]:
        """Inside: Lightning's watcher of the processes rank 0 launched reports a stopped one in one line and
        exits with status 1, instead of logging its own line and killing this process with SIGKILL. When this
        process is itself stopping on an exception (its own report comes), the watcher waits for it, and falls
        back to Lightning's kill after ``_WATCH_GRACE_S``."""
        # Lightning offers no hook here: its watcher's one polling method is replaced for the length of the run
        from lightning.fabric.strategies.launchers import subprocess_script

        watcher = subprocess_script._ChildProcessObserver
        original: Callable[[Any], bool] = watcher._run

        def poll(observer: Any) -> bool:
            return self._poll(observer, original)

        watcher._run = poll
        try:
            yield
        finally:
            watcher._run = original

    def _poll(self, observer: Any, original: Callable[[Any], bool]) -> bool:
        """One round of the watcher (Lightning's ``_ChildProcessObserver._run``): True when it may stop."""
        children = observer._child_processes
        for proc in children:
            proc.poll()
        if all(proc.returncode == 0 for proc in children):
            return True
        stopped = [(local_rank, p) for local_rank, p in enumerate(children, start=1) if p.returncode]
        if not stopped:
            return False
        trainer = self.trainer
        if trainer is not None and trainer.interrupted:
            now = time.monotonic()
            self._stopping_since = self._stopping_since or now
            return original(observer) if now - self._stopping_since > _WATCH_GRACE_S else False
        local_rank, proc = stopped[0]
        rank = local_rank if trainer is None else trainer.node_rank * trainer.num_devices + local_rank
        self.print_line(self.peer_line(f"the process of rank {rank} (PID {proc.pid}) {_ended(proc.returncode)}"))
        for other in children:
            if other.poll() is None:
                other.send_signal(signal.SIGKILL)  # as Lightning does: a process waiting in a collective may hang
        self.exit_now(1)

"""The process pool that trains a study's runs on this machine (``--workers N``), and how many local workers a
study gets (``local_workers``).

``ProcessPoolLauncher`` (a ``bhyt_pl.study.launch.launcher.Launcher``): N spawned worker processes with one torch
thread each, so N runs share the cores without oversubscribing them; on GPUs each worker owns one of them
(``devices``). It reports a run that raised as ``FAILED`` with the exception's text; a run that trained and recorded
its own failure (``RunResult.status == "error"``) is ``DONE``. With one worker the study trains in its own process
instead (``bhyt_pl.study.launch.inline``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.sharedctypes import SynchronizedArray

import torch

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.launcher import RunEvent, RunState
from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = ["ProcessPoolLauncher", "RunFunction", "available_cpus", "failure_text", "local_workers", "visible_gpus"]

RunFunction = Callable[[RunSpec], RunResult]

GPU_ACCELERATORS = ("gpu", "cuda")


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, which containers and ``taskset`` narrow): the default number
    of CPU workers, one run each."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (``0..n-1`` when it is unset):
    the ids to share out among workers, since a worker's ``CUDA_VISIBLE_DEVICES`` names devices of the machine, not
    of this process. CUDA stops at the first id it cannot use, so the count is torch's, not the list's length."""
    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def _uses_gpu(accelerator: str) -> bool:
    name = accelerator.lower()
    return name in GPU_ACCELERATORS or (name == "auto" and torch.cuda.device_count() > 0)


def local_workers(accelerator: str, workers: int | None, devices: int | str | None = 1) -> tuple[int, list[str] | None]:
    """How many local workers train a study's runs, and the GPU each one owns (``None``: no GPU is assigned).

    One GPU per worker, so every run sees exactly one device as ``cuda:0`` and keeps ``devices=1``: with a GPU
    accelerator (``gpu``, ``cuda``, or ``auto`` when CUDA has a device) and one device per run, ``workers``
    defaults to the visible GPUs and may not exceed them. On a CPU, or with several devices per run (torchrun,
    which places each rank itself), ``workers`` stays as given and defaults to ``available_cpus()``.

    Args:
        accelerator: the runs' ``--accelerator``.
        workers: ``--workers``; ``None``: the default above.
        devices: the runs' ``--devices`` (``1`` or ``"1"``: one device per run; None: the runs decide, and no
            GPU is assigned).

    Raises:
        UsageError: ``workers`` below 1, a GPU accelerator without a visible GPU, or more workers than GPUs.
    """
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    if str(devices) != "1" or not _uses_gpu(accelerator):
        return (available_cpus() if workers is None else workers), None
    gpus = visible_gpus()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = "CUDA_VISIBLE_DEVICES unset" if listed is None else f"CUDA_VISIBLE_DEVICES={listed!r}"
    if not gpus:
        raise UsageError(f"--accelerator {accelerator} but no GPU is visible ({where}); use --accelerator cpu")
    if workers is None:
        workers = len(gpus)
    if workers > len(gpus):
        raise UsageError(
            f"--workers {workers} exceeds the {len(gpus)} visible GPU(s) {','.join(gpus)} ({where}): each local "
            f"worker trains on its own GPU; give --workers {len(gpus)} or fewer"
        )
    return workers, gpus[:workers]


def failure_text(exc: BaseException) -> str:
    """How a run that raised is reported: the exception's type and message."""
    return f"{type(exc).__name__}: {exc}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now has the pid: not a worker of this pool, but taken
        return True
    return True


def _claim_device(owners: SynchronizedArray, devices: Sequence[str], pid: int) -> str:
    """The device of the first slot no live worker owns, now owned by ``pid``. A slot whose owner died is free again,
    so a worker that replaces a dead one takes over its GPU."""
    with owners.get_lock():
        for slot, owner in enumerate(owners):
            if owner == 0 or not _alive(owner):
                owners[slot] = pid
                return devices[slot]
    raise RuntimeError(f"no free GPU for worker {pid}: devices {list(devices)} are owned by {list(owners)}")


def _init_worker(owners: SynchronizedArray | None = None, devices: Sequence[str] = ()) -> None:
    if devices:
        # CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises: importing torch does not, the first CUDA call does
        if torch.cuda.is_initialized():
            raise RuntimeError("CUDA was initialised in a study worker before its GPU was assigned")
        os.environ["CUDA_VISIBLE_DEVICES"] = _claim_device(owners, devices, os.getpid())
    torch.set_num_threads(1)  # one thread per process: the workers share the cores without oversubscription
    logging.basicConfig(level=logging.WARNING, format="%(message)s")


class ProcessPoolLauncher:
    """Trains the started runs in ``workers`` spawned processes (``concurrent.futures.ProcessPoolExecutor``), one
    torch thread each; ``poll`` reports the runs that started or finished, in start order.

    Args:
        run: trains one run; it and every ``RunSpec`` are pickled to the workers, so it must be importable
            (a module-level function or a ``functools.partial`` of one).
        workers: processes.
        devices: one GPU id per worker (``local_workers``): each worker's ``CUDA_VISIBLE_DEVICES`` is its own id,
            set as it starts, before anything in it initialises CUDA, so its runs see that GPU alone as ``cuda:0``.
            ``None``: the workers inherit this process's environment.

    Fresh interpreters (``spawn``) rather than forks: a fork would copy this process's torch thread pools (and
    CUDA cannot be forked). A worker that dies (a segfault, the kernel's out-of-memory killer) breaks the pool:
    ``concurrent.futures`` stops every worker and fails every run pending on the pool, each reported ``FAILED``
    with ``BrokenProcessPool`` (a later study invocation retrains them: a failed run is not reused). The next
    ``start`` builds a fresh pool whose workers claim every device again, so no GPU is lost to the dead worker.
    """

    def __init__(self, run: RunFunction, workers: int, devices: Sequence[str] | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if devices is not None and len(devices) != workers:
            raise ValueError(f"devices must name one GPU per worker ({workers}), got {list(devices)}")
        self.run = run
        self.workers = workers
        self.devices = None if devices is None else tuple(str(device) for device in devices)
        self._executor = self._new_pool()
        self._futures: dict[Future, RunSpec] = {}  # in start order
        self._running: set[Future] = set()

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        initargs = () if self.devices is None else (context.Array("i", len(self.devices)), self.devices)
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker, initargs=initargs)

    def start(self, specs: Sequence[RunSpec]) -> None:
        for spec in specs:
            try:
                future = self._executor.submit(self.run, spec)
            except BrokenProcessPool:  # a worker died: its pool has failed its runs and stopped; train on a new one
                self._executor.shutdown(wait=True)
                self._executor = self._new_pool()
                future = self._executor.submit(self.run, spec)
            self._futures[future] = spec

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        if not self._futures:
            return []
        done, _ = wait(list(self._futures), timeout=timeout, return_when=FIRST_COMPLETED)
        events = []
        for future, spec in list(self._futures.items()):
            if future in done:
                del self._futures[future]
                self._running.discard(future)
                try:
                    events.append(RunEvent(spec, RunState.DONE, result=future.result()))
                except Exception as exc:  # noqa: BLE001 - a run that raised, or one lost with a broken pool, fails alone
                    events.append(RunEvent(spec, RunState.FAILED, error=failure_text(exc)))
            elif future not in self._running and future.running() and len(self._running) < self.workers:
                # the pool marks a run running once it sits in its call queue (workers + 1 of them), not when a
                # worker takes it: the first `workers` of them, in submission order, are the ones training
                self._running.add(future)
                events.append(RunEvent(spec, RunState.RUNNING))
        return events

    def close(self) -> None:
        """Stops the workers; runs not yet started are cancelled (after an interrupt nothing new starts)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()

"""The study's runs as submitit jobs: job arrays on a SLURM cluster, or processes of submitit's local executor.

``SubmititLauncher`` implements the study's ``Launcher`` (``bhyt_pl.study.launch.launcher``) on submitit
(https://github.com/facebookincubator/submitit), the SLURM launcher of Hydra and of many research codebases:

- ``start(specs)`` submits the runs as one job array (``executor.map_array``), throttled so that at most
  ``max_concurrent`` runs of the study run at once, and records every job in the study folder
  (``job_records``: label, job id, try number, time) before it returns. The jobs are named after the study:
  SLURM gives every task of an array the array's one name, so a run's label is in the record and in the job's
  submitted pickle (``<study>/jobs/<job id>/``), not in the job name.
- ``poll(timeout)`` reads the jobs' states from ``sacct`` (submitit's source of truth; it reads nothing else)
  every ``poll_interval_s``, and each job's result file every second. A job's result is the run's
  ``RunResult``; an exception in the job, a result with ``status == "error"``, a job that ended without a
  result, and a lost job (no accounting entry and no result for ``lost_after_s``; submitit would wait on it
  forever, as ``UNKNOWN``) each fail one try. A failed run is submitted again, up to ``retries`` more tries,
  and reported ``FAILED`` only when its tries are spent, with every try's error.
- A new launcher on the same folder carries on from the record: it collects runs whose jobs finished,
  re-attaches to jobs still queued or running, resubmits failed ones that have tries left, and never submits a
  run twice. A job submitted by a driver that died before recording it (an orphan) is found by its folder
  under ``<study>/jobs/`` and adopted.
- ``close()`` leaves queued and running jobs to a later driver; ``cancel()`` stops them (``scancel``).

Inside a job, ``CheckpointableRun`` sets torch's threads to the job's CPUs per task and makes the run
checkpointable: submitit's preemption and timeout signal (``USR2``; Lightning's own requeue signal is ``USR1``)
sets ``preemption_requested()``; the run saves its state at the end of its current step and raises
``RunPreempted``; submitit then requeues the same job with the same spec, and the run resumes from what it
saved. A run that does not stop within half of ``signal_delay_s`` is requeued by submitit where it is. SIGTERM
(SLURM's preemption signal on a cluster without ``PreemptParameters=send_user_signal``, and its cancellation
signal) makes the run save the same way, then the job exits without requeueing itself (``_StopRequest``).

SLURM's states (``sacct``'s ``State``, first word) as the launcher reads them:

=============================================================  =============================================
``PENDING``, ``REQUEUED``, ``REQUEUE_FED``, ``REQUEUE_HOLD``,  ``QUEUED``
``RESV_DEL_HOLD``, ``SUSPENDED``
``RUNNING``, ``COMPLETING``, ``CONFIGURING``, ``STAGE_OUT``,   ``RUNNING``
``SIGNALING``, ``RESIZING``, ``STOPPED``
``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMEOUT``,         ended: ``DONE`` with the job's result, else
``NODE_FAIL``, ``OUT_OF_MEMORY``, ``BOOT_FAIL``, ``DEADLINE``,  a failed try once no result has appeared for
``PREEMPTED``, ``REVOKED``, ``SPECIAL_EXIT``                   ``result_wait_s`` (a shared filesystem lags)
no entry                                                       lost after ``lost_after_s`` without a result
=============================================================  =============================================

A job's result file counts first, whatever ``sacct`` says. With the local executor a job runs while its
controller process does (``psutil`` finds an earlier driver's); it has no queue and no accounting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import submitit
import torch
from submitit.core.utils import DelayedSubmission, FailedJobError, FailedSubmissionError
from submitit.slurm.slurm import SlurmInfoWatcher

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.job_records import Event, JobRecord, JobRecords
from bhyt_pl.study.launch.launcher import RunEvent, RunState
from bhyt_pl.study.protocol.spec import RunStatus
from bhyt_pl.study.run.preemption import _PREEMPTED, RunPreempted, preemption_requested  # the run reads them too
from bhyt_pl.validation import raise_if_problems

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = [
    "CLUSTERS",
    "CheckpointableRun",
    "ClusterSettings",
    "RunPreempted",
    "SubmititLauncher",
    "preemption_requested",
]

CLUSTERS = ("slurm", "local")
"""submitit executors a study may use: a SLURM cluster, or processes on this machine (``LocalExecutor``)."""

_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}
_ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "REVOKED",
    "SPECIAL_EXIT",
}
_LOCAL_ENDED = {"FINISHED", "INTERRUPTED"}  # submitit's LocalJob states once the job's controller has exited
_STUDY_NAME = re.compile(r"[\w.@:+=/-]+")

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class ClusterSettings:
    """Where and how a study's runs execute as submitit jobs; names follow submitit's ``AutoExecutor``.

    Every run is one single-node, single-task job. Fields a cluster does not use are ignored there (the local
    executor has no partition, account, QOS, memory or ``#SBATCH`` lines).

    Example:
        >>> settings = ClusterSettings(partition="gpu", timeout_min=240, gpus_per_node=1, cpus_per_task=8)
        >>> settings.executor_parameters("depth")["slurm_partition"]
        'gpu'
    """

    cluster: str = "slurm"
    """``slurm`` (``sbatch`` job arrays) or ``local`` (submitit's local executor: one process per run)."""
    partition: str | None = None
    """SLURM partition (``slurm_partition``)."""
    account: str | None = None
    """SLURM account charged (``slurm_account``)."""
    qos: str | None = None
    """SLURM quality of service (``slurm_qos``)."""
    timeout_min: int = 60
    """Time limit of one job, in minutes. A job that reaches it is requeued and resumes (checkpointable runs);
    the local executor's default of 2 minutes would kill a run under load, so it is always set."""
    gpus_per_node: int = 0
    """GPUs per run (a run is a one-node job)."""
    cpus_per_task: int = 1
    """CPUs per run; torch's threads inside the job follow it."""
    mem_gb: float | None = None
    """Memory per run in GB (None: the partition's default)."""
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    """Extra ``#SBATCH`` lines as ``{"flag": value}`` (``slurm_additional_parameters``), e.g.
    ``{"constraint": "a100", "mail-type": "FAIL"}``; ``True`` writes a bare flag."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the job before the run (``slurm_setup``), e.g. ``("module load cuda/12.4",)``."""
    max_concurrent: int = 0
    """Most runs of the study running at once (0: no cap): a SLURM job array's ``%N`` throttle, and the
    launcher holds back runs while earlier arrays fill the cap."""
    retries: int = 2
    """Tries after a run's first one fails (a crashed, killed or lost job, or a result with status ``error``)."""
    lost_after_s: float = 600.0
    """A job with no accounting entry and no result for this long is lost: cancelled and resubmitted."""
    poll_interval_s: float = 30.0
    """Seconds between two ``sacct`` calls (one call covers every job of the study)."""
    result_wait_s: float = 15.0
    """How long a job that ended is waited on for its result file to appear (a shared filesystem lags;
    submitit waits 15 s as well)."""
    signal_delay_s: int = 120
    """Seconds before the time limit at which SLURM sends submitit's ``USR2``: the run has half of it to
    save its state at the end of a step, then submitit requeues the job."""

    def __post_init__(self) -> None:
        if isinstance(self.setup, str):
            raise TypeError(f"setup must be a list of shell lines, got the string {self.setup!r}; wrap it in a list")
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "additional_parameters", dict(self.additional_parameters))
        problems = []
        if self.cluster not in CLUSTERS:
            problems.append(f"cluster must be one of {', '.join(CLUSTERS)}, got {self.cluster!r}")
        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                problems.append(f"{name} must be a non-empty name or None, got {value!r}")
        minimum = {"timeout_min": 1, "gpus_per_node": 0, "cpus_per_task": 1, "max_concurrent": 0, "retries": 0}
        for name, lowest in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                problems.append(f"{name} must be an integer >= {lowest}, got {value!r}")
        for name in ("lost_after_s", "poll_interval_s", "result_wait_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                problems.append(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.mem_gb is not None and (not isinstance(self.mem_gb, int | float) or not self.mem_gb > 0):
            problems.append(f"mem_gb must be a number > 0 or None, got {self.mem_gb!r}")
        if not isinstance(self.signal_delay_s, int) or not 0 <= self.signal_delay_s:
            problems.append(f"signal_delay_s must be an integer >= 0, got {self.signal_delay_s!r}")
        elif isinstance(self.timeout_min, int) and self.signal_delay_s >= 60 * self.timeout_min:
            problems.append(
                f"signal_delay_s ({self.signal_delay_s}) must be shorter than the time limit "
                f"(timeout_min {self.timeout_min} = {60 * self.timeout_min} s)"
            )
        if not all(isinstance(line, str) for line in self.setup):
            problems.append(f"setup must hold shell lines (strings), got {list(self.setup)!r}")
        if not all(isinstance(key, str) and key for key in self.additional_parameters):
            problems.append(f"additional_parameters keys must be sbatch flag names, got {self.additional_parameters!r}")
        raise_if_problems("cluster settings", problems)

    def executor_parameters(self, study: str) -> dict[str, Any]:
        """The ``AutoExecutor.update_parameters`` arguments for this study's jobs (the throttle excepted)."""
        parameters: dict[str, Any] = {
            "name": study,
            "timeout_min": self.timeout_min,
            "nodes": 1,
            "tasks_per_node": 1,
            "cpus_per_task": self.cpus_per_task,
        }
        if self.gpus_per_node:  # no --gpus-per-node=0 line: some clusters reject a zero GPU request
            parameters["gpus_per_node"] = self.gpus_per_node
        if self.cluster == "slurm":
            optional = {"partition": self.partition, "account": self.account, "qos": self.qos}
            parameters.update({f"slurm_{k}": v for k, v in optional.items() if v is not None})
            if self.mem_gb is not None:
                parameters["mem_gb"] = self.mem_gb
            if self.additional_parameters:
                parameters["slurm_additional_parameters"] = dict(self.additional_parameters)
            if self.setup:
                parameters["slurm_setup"] = list(self.setup)
            parameters["slurm_signal_delay_s"] = self.signal_delay_s
        return parameters

    def ignored(self) -> list[str]:
        """The fields set here that this cluster does not use."""
        if self.cluster != "local":
            return []
        fields = {"partition": self.partition, "account": self.account, "qos": self.qos, "mem_gb": self.mem_gb}
        fields |= {"additional_parameters": self.additional_parameters, "setup": self.setup}
        return [name for name, value in fields.items() if value]


# ----------------------------------------------------------------------------- inside a job
def _preemption_signal() -> signal.Signals:
    # submitit's signal: USR2 unless SUBMITIT_PREEMPT_SIGNAL names another
    return signal.Signals["SIG" + submitit.JobEnvironment.USR_SIG]


TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
"""A job's exit status after it saved its run on SIGTERM: a shell's status for a process ended by SIGTERM."""


def job_cpus(default: int) -> int:
    """CPUs this job may use: SLURM's ``SLURM_CPUS_PER_TASK`` in a SLURM job, else ``default`` (the settings')."""
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(os.environ["SLURM_CPUS_PER_TASK"])
    return default


def _remove_folder_template() -> None:
    """Removes the literal ``jobs/%j`` folder submitit's local job controller makes each time it starts a job's task
    (it creates its folder template as is; every file goes to ``jobs/<job id>/``, so the folder stays empty)."""
    folder = os.environ.get("SUBMITIT_FOLDER")  # the executor's folder template, as the job was given it
    if folder and "%" in Path(folder).name:
        with contextlib.suppress(OSError):  # absent already, or (not ours) not empty
            Path(folder).rmdir()


class _StopRequest:
    """The stop signals a job's run got, and how the job ends once the run has stopped (``hand_over``).

    - The preemption or timeout signal (``USR2``): submitit's handler, which checkpoints, requeues the job and exits.
    - ``SIGTERM`` alone: the job exits (``TERMINATED_EXIT_CODE``) without requeueing itself. SLURM sends SIGTERM,
      then SIGKILL after its grace time, to preempt a job (unless the cluster sets
      ``PreemptParameters=send_user_signal``) and to cancel one (``scancel``, the driver's ``cancel``): a preempted
      job comes back by SLURM's own requeue (``PreemptMode=REQUEUE``) or as the launcher's next try, and resumes from
      the run's save either way, while a cancelled job stays cancelled (``scontrol requeue`` would revive it).
      submitit itself logs SIGTERM and carries on ("Bypassing signal SIGTERM"), so the run would lose every step
      since its start at the SIGKILL.
    """

    def __init__(self, preemption: signal.Signals, handlers: dict[signal.Signals, Any]) -> None:
        self.preemption, self.handlers = preemption, handlers
        self.signals: list[signal.Signals] = []
        self.handed_over = False
        self._timers: list[threading.Timer] = []

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    def on_signal(self, sig: int, frame: Any, grace_s: float) -> None:
        """The first stop signal asks the run to save at its step's end; the same signal again (the run did not
        stop within ``grace_s``: the timer resends it) hands over at once, wherever the run is."""
        received = signal.Signals(sig)
        if received in self.signals:
            self.hand_over(frame)
            return
        self.signals.append(received)
        _PREEMPTED.set()
        log.warning("signal %s: the run saves at the end of its step, then the job %s", received.name,
                    "is requeued" if received == self.preemption else "exits")  # fmt: skip
        timer = threading.Timer(grace_s, signal.pthread_kill, (threading.main_thread().ident, sig))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def hand_over(self, frame: Any = None) -> None:
        """Ends the job the way its signals ask (class docstring): raises ``SystemExit`` (submitit's after a
        requeue, or ``TERMINATED_EXIT_CODE``), unless submitit's handler returns (a task of rank > 0)."""
        self.cancel_timers()
        self.handed_over = True
        if self.preemption in self.signals:
            self.handlers[self.preemption](self.preemption, frame)  # submitit: checkpoint, requeue, exit
            return
        log.warning("SIGTERM: the job exits without requeueing itself; the run resumes from its save when the job "
                    "runs again (SLURM's requeue or the study's next try)")  # fmt: skip
        raise SystemExit(TERMINATED_EXIT_CODE)

    def cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()


@contextlib.contextmanager
def _deferred_stop(grace_s: float) -> Iterator[_StopRequest | None]:
    """Defers the job's stop signals (submitit's preemption signal and SIGTERM) while the run reaches the end of a
    step.

    submitit's handler checkpoints and requeues wherever the preemption signal lands, possibly mid-step, and it
    ignores SIGTERM. Here the first signal only sets ``preemption_requested()``; the run saves and raises
    ``RunPreempted``, and the job ends through the yielded request's ``hand_over``. If the run has not stopped after
    ``grace_s`` seconds, the signal is sent again and the hand-over happens where the run is. Yields None outside a
    submitit job (no handler to defer: both signals are left alone).
    """
    preemption = _preemption_signal()
    handlers = {sig: signal.getsignal(sig) for sig in (preemption, signal.SIGTERM)}
    if not callable(handlers[preemption]):
        yield None
        return
    _PREEMPTED.clear()
    request = _StopRequest(preemption, handlers)
    for sig in handlers:
        signal.signal(sig, lambda sig, frame: request.on_signal(sig, frame, grace_s))
    try:
        yield request
    finally:
        request.cancel_timers()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        _PREEMPTED.clear()  # the request was this run's


class CheckpointableRun(submitit.helpers.Checkpointable):
    """The callable every job runs: one run of the study, checkpointable.

    In a job, a run that ends with a ``BaseException`` other than a stop (``KeyboardInterrupt``: the local
    controller's SIGINT; a ``SystemExit``) is raised again as a ``RuntimeError`` naming it, so that submitit records
    it as the job's error and the driver reports that cause, not the last line of the job's log.

    Args:
        run: the study's run function (``RunSpec -> RunResult``), picklable. A requeued job calls it again
            with the same spec: it resumes from what it saved in its run folder, if anything.
        cpus_per_task: torch's threads in the job when SLURM does not say (the local executor).
        grace_s: seconds the run has to stop at a step end after a stop signal.
    """

    def __init__(self, run: Callable[[RunSpec], RunResult], cpus_per_task: int = 1, grace_s: float = 60.0) -> None:
        self.run = run
        self.cpus_per_task = cpus_per_task
        self.grace_s = grace_s

    def __call__(self, spec: RunSpec) -> RunResult:
        torch.set_num_threads(job_cpus(self.cpus_per_task))
        _remove_folder_template()
        with _deferred_stop(self.grace_s) as stop:
            try:
                return self.run(spec)
            except RunPreempted:
                if stop is None:
                    raise
                stop.hand_over()  # USR2: submitit's checkpoint() below, requeue, exit; SIGTERM: exit
                raise
            except (KeyboardInterrupt, SystemExit) as exc:
                if stop is None or stop.handed_over:  # not in a job; or the job is ending as its signal asked
                    raise
                if stop.requested:  # the run ended on the stop signal without saving (Lightning's SIGTERM exit)
                    stop.hand_over()
                    raise
                what = type(exc).__name__ + (f": {exc}" if str(exc) else "")
                raise RuntimeError(f"the run ended with {what}") from exc

    def checkpoint(self, spec: RunSpec) -> DelayedSubmission:
        """What the requeued job runs: the same run, which resumes from its run folder."""
        return DelayedSubmission(self, spec)


# ----------------------------------------------------------------------------- the launcher
def spec_dict(spec: RunSpec) -> dict[str, Any]:
    """The spec as plain JSON data: what the record stores and compares (tuples read back as lists)."""
    return json.loads(json.dumps(asdict(spec), default=str))


@dataclass
class _Try:
    """One submitted job of a run."""

    attempt: int
    job: submitit.Job
    array: str | None
    throttle: int
    missing_since: float | None = None
    ended_since: float | None = None
    done_recorded: bool = False


@dataclass
class _Run:
    """What the launcher knows of one started run."""

    spec: RunSpec
    attempts: int = 0  # tries submitted for this spec
    failures: list[str] = field(default_factory=list)  # one line per failed try (cancelled ones excepted)
    current: _Try | None = None
    reported: RunState | None = None
    final: RunEvent | None = None  # the DONE or FAILED event, once there is one


class SubmititLauncher:
    """Runs a study's runs as submitit jobs (module docstring): a ``bhyt_pl.study.launch.launcher.Launcher``.

    Args:
        settings: cluster, resources, throttle, retries and timings.
        folder: the study folder, on a filesystem the jobs share: the record ``jobs.jsonl`` and submitit's
            ``jobs/<job id>/`` folders (pickles, logs) go there.
        study: the study's name: the jobs' name (``squeue --name``, ``scancel --name``).
        run: the run function, ``RunSpec -> RunResult``, picklable (it is sent to the jobs).

    Raises:
        UsageError: another driver holds the folder, the study name is not a job name, or SLURM's tools are
            missing for ``cluster="slurm"``.

    Example:
        >>> launcher = SubmititLauncher(ClusterSettings(partition="gpu"), Path("out"), "depth", run)  # doctest: +SKIP
        >>> launcher.start(specs)  # doctest: +SKIP
        >>> while pending: events = launcher.poll(60)  # doctest: +SKIP
    """

    def __init__(
        self, settings: ClusterSettings, folder: Path, study: str, run: Callable[[RunSpec], RunResult]
    ) -> None:
        if not _STUDY_NAME.fullmatch(study):
            raise UsageError(
                f"study name {study!r} is not a job name: use letters, digits and . _ - / @ : + = (no spaces or |)"
            )
        self.settings, self.folder, self.study = settings, Path(folder).absolute(), study
        for name in settings.ignored():
            log.warning("cluster settings: %s is ignored by the %s executor", name, settings.cluster)
        try:
            self.executor = submitit.AutoExecutor(folder=self.folder / "jobs" / "%j", cluster=settings.cluster)
        except RuntimeError as exc:  # SlurmExecutor looks for srun on PATH
            raise UsageError(f"cluster 'slurm' needs SLURM's tools on PATH ({exc}); cluster 'local' runs here") from exc
        self.executor.update_parameters(**settings.executor_parameters(study))
        self.function = CheckpointableRun(run, settings.cpus_per_task, settings.signal_delay_s / 2)
        self.records = JobRecords(self.folder)
        self.records.lock()
        self._history = self.records.read()
        self._runs: dict[str, _Run] = {}
        self._pending: list[_Run] = []
        self._events: list[RunEvent] = []
        self._last_sacct = -math.inf
        self._orphans = self._find_orphans()
        self._closed = False

    # -- Launcher
    def start(self, specs: Sequence[RunSpec]) -> None:
        """Starts the runs not started before: re-attaches to their recorded jobs, else submits them in one array.

        Returns once every submitted job is in the record.
        """
        self._check_open()
        fresh = []
        for spec in specs:
            run = self._runs.get(spec.label)
            if run is not None:
                if run.final is not None:  # a final state is reported once per start
                    self._events.append(run.final)
                continue
            run = self._runs[spec.label] = _Run(spec)
            fresh.append(run)
        for run in fresh:
            self._resume(run)
        self._submit_pending()

    def poll(self, timeout: float | None = None) -> list[RunEvent]:
        """The runs' state changes; waits up to ``timeout`` seconds for one (None: until one), never for a job
        nothing more can be learnt about (module docstring: lost jobs)."""
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._refresh()
            if self._events:
                events, self._events = self._events, []
                return events
            if not self._pending and not any(run.current for run in self._runs.values() if run.final is None):
                return []  # nothing started is still going
            wait = min(1.0, self.settings.poll_interval_s)
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return []
            time.sleep(wait)

    def close(self) -> None:
        """Releases the study folder; queued and running jobs go on for a later driver (``cancel`` stops them)."""
        self._remove_folder_template()
        self.records.unlock()
        self._closed = True

    def _remove_folder_template(self) -> None:
        """submitit makes its folder template (``jobs/%j``) as an empty folder of that literal name: when it submits
        an array, and (the local executor) each time a job's controller starts its task, which the job removes
        itself (``CheckpointableRun``). A task that failed before its run leaves it: removed here too."""
        with contextlib.suppress(OSError):  # absent, or not empty (not submitit's)
            (self.folder / "jobs" / "%j").rmdir()

    def __enter__(self) -> SubmititLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this launcher is closed: a new SubmititLauncher on the folder carries on")

    # -- beyond the protocol
    def cancel(self, labels: Sequence[str] | None = None) -> list[str]:
        """Cancels the runs' jobs (all started runs when ``labels`` is None) and reports them ``FAILED``.

        A cancelled try does not count against the run's retries: a later driver submits it again.

        Returns:
            The cancelled job ids.
        """
        unknown = [label for label in labels or () if label not in self._runs]
        if unknown:
            raise ValueError(f"cancel: no started run is labelled {', '.join(map(repr, unknown))}")
        chosen = [self._runs[label] for label in labels] if labels is not None else list(self._runs.values())
        cancelled, records = [], []
        for run in chosen:
            if run.final is not None:
                continue
            if run in self._pending:
                self._pending.remove(run)
            if run.current is not None:
                run.current.job.cancel(check=False)
                cancelled.append(run.current.job.job_id)
                records.append(self._record("cancelled", run))
                run.current = None
            self._report(run, RunState.FAILED, error="cancelled by the study's driver")
        self.records.append(records)
        return cancelled

    # -- resuming from the record
    def _resume(self, run: _Run) -> None:
        """Applies the record's tries of this run: re-attach, count failed tries, or queue a submission."""
        label, wanted = run.spec.label, spec_dict(run.spec)
        records = [record for record in self._history if record.label == label]
        outcome = {record.job_id: record for record in records if record.event != "submitted"}
        latest: list[JobRecord] = []  # the submissions since the label's spec last changed
        for record in (record for record in records if record.event == "submitted"):
            if latest and record.spec != latest[-1].spec:
                latest = []
            latest.append(record)
        if latest and latest[-1].spec != wanted:  # an earlier run under this label, with other settings
            live = [r.job_id for r in latest if r.job_id not in outcome and not self._has_ended(r.job_id)]
            if live:  # both would write the same run folder
                raise UsageError(
                    f"run {label!r} has job(s) {', '.join(live)} in {self.records.path} with other settings, still "
                    "queued or running; cancel them (scancel) or use another study folder"
                )
            latest = []
        for record in latest:
            run.attempts = max(run.attempts, record.attempt)
            ended = outcome.get(record.job_id)
            run.current = None
            if ended is None or ended.event == "done":
                run.current = _Try(record.attempt, self._job(record.job_id), record.array, record.throttle or 1)
                run.current.done_recorded = ended is not None
            elif ended.event == "failed":
                run.failures.append(f"try {record.attempt} (job {record.job_id}): {ended.error}")
            # cancelled by a driver: submitted again without spending a try
        if run.current is None:
            self._adopt_orphan(run)
        if run.current is not None:
            log.info("study run %s: re-attached to job %s (try %d)", label, run.current.job.job_id, run.attempts)
            self._last_sacct = -math.inf  # ask at once
        elif len(run.failures) > self.settings.retries:
            self._report(run, RunState.FAILED, error=self._failure_text(run))
        else:
            self._pending.append(run)
            self._report(run, RunState.QUEUED)

    def _has_ended(self, job_id: str) -> bool:
        """Whether a recorded job is over: it left a result, its process is gone, or SLURM says it ended or no
        longer knows it."""
        job = self._job(job_id)
        if job.paths.result_pickle.exists():
            return True
        if self.settings.cluster == "local":
            return self._local_state(job) != "RUNNING"
        states = self._cluster_states([job_id])
        if states is None:
            return False  # sacct did not answer: it may still run
        state = states.get(job_id, "").split(" ")[0]
        return state not in _QUEUED and state not in _RUNNING

    def _find_orphans(self) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """Job folders with a submitted pickle and no record: label -> (job id, spec), oldest first.

        submitit writes ``jobs/<id>/<id>_submitted.pkl`` as soon as ``sbatch`` answers, before this launcher
        can record the job, so a driver killed in between leaves such a folder.
        """
        known = {record.job_id for record in self._history}
        root = self.folder / "jobs"
        orphans: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if not root.is_dir():
            return orphans
        for path in sorted(root.iterdir(), key=lambda p: _job_sort_key(p.name)):
            pickle = path / f"{path.name}_submitted.pkl"
            if path.name in known or not pickle.is_file():
                continue
            try:
                spec = DelayedSubmission.load(pickle).args[0]
                orphans.setdefault(spec.label, []).append((path.name, spec_dict(spec)))
            except Exception as exc:  # noqa: BLE001 - a foreign or damaged pickle is no orphan of ours
                log.warning("%s: not a study job (%s); left alone", pickle, exc)
        return orphans

    def _adopt_orphan(self, run: _Run) -> None:
        """Takes over the newest unrecorded job of this run, recording it as the run's next try."""
        for job_id, spec in reversed(self._orphans.pop(run.spec.label, [])):
            if spec != spec_dict(run.spec):
                continue
            run.attempts += 1
            array = job_id.split("_")[0] if "_" in job_id else None
            run.current = _Try(run.attempts, self._job(job_id), array, 1)
            self.records.append([self._record("submitted", run)])
            log.warning(
                "study run %s: adopted job %s, submitted by a driver that stopped first", run.spec.label, job_id
            )
            return

    # -- submitting
    def _free_slots(self) -> float:
        """Runs that may start now under ``max_concurrent``: an array holds min(throttle, its unfinished runs)."""
        if not self.settings.max_concurrent:
            return math.inf
        arrays: dict[str, list[_Try]] = {}
        held = 0
        for run in self._runs.values():
            if run.current is None or run.final is not None:
                continue
            if run.current.array is None:
                held += 1
            else:
                arrays.setdefault(run.current.array, []).append(run.current)
        held += sum(min(tries[0].throttle, len(tries)) for tries in arrays.values())
        return self.settings.max_concurrent - held

    def _submit_pending(self) -> None:
        free = self._free_slots()
        if not self._pending or free <= 0:
            return
        # SLURM queues a whole array and starts its tasks `throttle` at a time; the local executor starts every
        # job at once, so it gets only as many as may run
        count = len(self._pending) if self.settings.cluster == "slurm" else int(min(free, len(self._pending)))
        batch = self._pending[:count]
        throttle = int(min(free, count))
        if self.settings.cluster == "slurm":
            self.executor.update_parameters(slurm_array_parallelism=throttle)
        try:
            jobs = self.executor.map_array(self.function, [run.spec for run in batch])
        except (FailedJobError, FailedSubmissionError, OSError) as exc:
            raise RuntimeError(f"submitting {count} study run(s) failed: {exc}") from exc
        self._remove_folder_template()
        array = jobs[0].job_id.split("_")[0] if "_" in jobs[0].job_id else None
        for run, job in zip(batch, jobs, strict=True):
            run.attempts += 1
            run.current = _Try(run.attempts, job, array, throttle if array else 1)
        self.records.append([self._record("submitted", run) for run in batch])
        del self._pending[:count]
        self._last_sacct = -math.inf
        log.info("study: submitted %d run(s) as %s", count, f"array {array} (%{throttle})" if array else "job(s)")

    # -- observing
    def _refresh(self) -> None:
        active = [run for run in self._runs.values() if run.current is not None and run.final is None]
        now = time.time()
        states = None
        if self.settings.cluster == "slurm" and active and now - self._last_sacct >= self.settings.poll_interval_s:
            states = self._cluster_states([run.current.job.job_id for run in active])  # type: ignore[union-attr]
            self._last_sacct = now
        for run in active:
            self._observe(run, states, now)
        self._submit_pending()

    def _observe(self, run: _Run, states: dict[str, str] | None, now: float) -> None:
        attempt = run.current
        assert attempt is not None
        job = attempt.job
        if job.paths.result_pickle.exists():
            self._collect(run)
            return
        if self.settings.cluster == "local":
            state = self._local_state(job)
        elif states is None:
            return  # no news from sacct this time
        else:
            state = states.get(job.job_id, "").split(" ")[0]  # "CANCELLED by 1234" -> CANCELLED
        if not state:
            attempt.missing_since = attempt.missing_since or now
            if now - attempt.missing_since >= self.settings.lost_after_s:
                job.cancel(check=False)  # should it reappear, it must not run beside its replacement
                self._fail(run, f"lost: no accounting entry and no result for {self.settings.lost_after_s:g} s")
            return
        attempt.missing_since = None
        if state in _ENDED or state in _LOCAL_ENDED:
            attempt.ended_since = attempt.ended_since or now
            if now - attempt.ended_since >= self.settings.result_wait_s:
                self._fail(run, f"the job ended ({state}) without a result{_log_tail(job)}")
            return
        attempt.ended_since = None
        if state in _RUNNING:
            self._report(run, RunState.RUNNING)
        else:
            if state not in _QUEUED:
                log.warning("job %s: unknown SLURM state %r, taken as queued", job.job_id, state)
            self._report(run, RunState.QUEUED)

    def _collect(self, run: _Run) -> None:
        assert run.current is not None
        try:
            result = run.current.job.result()
        except Exception as exc:  # noqa: BLE001 - an exception in the job fails this try
            self._fail(run, _job_error(exc, run.current.job))
            return
        if getattr(result, "status", None) == RunStatus.ERROR:
            self._fail(run, f"the run ended with status error: {result.error}")
            return
        if not run.current.done_recorded:
            self.records.append([self._record("done", run)])
        self._report(run, RunState.DONE, result=result)

    def _fail(self, run: _Run, error: str) -> None:
        attempt = run.current
        assert attempt is not None
        self.records.append([self._record("failed", run, error=error)])
        run.failures.append(f"try {attempt.attempt} (job {attempt.job.job_id}): {error}")
        run.current = None
        if len(run.failures) > self.settings.retries:
            self._report(run, RunState.FAILED, error=self._failure_text(run))
            return
        log.warning(
            "study run %s: try %d failed (%s); submitting try %d of %d",
            run.spec.label,
            attempt.attempt,
            error,
            len(run.failures) + 1,
            self.settings.retries + 1,
        )
        self._pending.insert(0, run)  # a retry goes before runs that have not started
        self._report(run, RunState.QUEUED)

    def _failure_text(self, run: _Run) -> str:
        tries = len(run.failures)
        return f"failed all {tries} tr{'y' if tries == 1 else 'ies'}: " + "; ".join(run.failures)

    def _report(self, run: _Run, state: RunState, result: RunResult | None = None, error: str | None = None) -> None:
        """Queues the run's event when its state changed (a final state always: once per start)."""
        final = state in (RunState.DONE, RunState.FAILED)
        if state == run.reported and not final:
            return
        run.reported = state
        event = RunEvent(run.spec, state, result, error)
        if final:
            run.final = event
        self._events.append(event)

    def _record(self, event: Event, run: _Run, error: str | None = None) -> JobRecord:
        attempt = run.current
        assert attempt is not None
        submitted = event == "submitted"
        return JobRecord(
            event,
            run.spec.label,
            attempt.job.job_id,
            attempt.attempt,
            time.time(),
            spec=spec_dict(run.spec) if submitted else None,
            array=attempt.array if submitted else None,
            throttle=attempt.throttle if submitted else None,
            error=error,
        )

    # -- the cluster
    def _job(self, job_id: str) -> submitit.Job:
        """submitit's handle on a job of this study, from its id alone (a later driver's re-attachment)."""
        if self.settings.cluster == "slurm":
            return submitit.SlurmJob(folder=self.folder / "jobs" / "%j", job_id=job_id)
        return submitit.LocalJob(folder=self.folder / "jobs" / "%j", job_id=job_id)

    def _cluster_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        """``sacct``'s State of each job (absent: no accounting entry), or None when sacct did not answer.

        The command and its parsing are submitit's (``SlurmInfoWatcher``); the launcher calls it on its own
        schedule, because the watcher stops asking about a job it believes done (a ``SUSPENDED`` one, say).
        """
        command = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]
        for array in sorted({job_id.split("_")[0] for job_id in job_ids}):
            command += ["-j", array]
        try:
            output = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("sacct did not answer (%s); job states unchanged", exc)
            return None
        return {job_id: info.get("State", "") for job_id, info in SlurmInfoWatcher().read_info(output).items()}

    def _local_state(self, job: submitit.Job) -> str:
        """A local job's state: ``RUNNING`` while its controller process runs (this driver's child, or an earlier
        driver's), then ``FINISHED`` (or ``INTERRUPTED``: the controller was killed)."""
        state = job.state  # submitit knows only the processes this driver started
        if state in ("RUNNING", *_LOCAL_ENDED):
            return state
        try:
            process = psutil.Process(int(job.job_id))
            alive = (
                process.status() != psutil.STATUS_ZOMBIE
                and "submitit.local._local" in process.cmdline()
                and str(self.folder) in " ".join(process.cmdline())
            )
        except (psutil.Error, ValueError):
            alive = False
        return "RUNNING" if alive else "FINISHED"


def _job_sort_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("_"))


_TRACEBACK = "Traceback (most recent call last):"


def exception_line(text: str) -> str | None:
    """The ``Type: message`` line of the last exception in a Python traceback's text (the message's first line, not
    what follows it: more message lines, a warning printed later), or None without a traceback."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line.strip() and not line[0].isspace():  # the frames are indented; the exception's line is not
            return line.strip()
    return None


def _job_error(exc: Exception, job: submitit.Job) -> str:
    """The exception the job raised (its type and message, from the traceback submitit recorded), and where the
    job's log is."""
    text = str(exc)
    if isinstance(exc, FailedJobError) and "----------------------" in text:
        text = text.split("----------------------")[1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = exception_line(text) or (lines[-1] if lines else type(exc).__name__)
    return f"{line} (log: {job.paths.stderr})"


def _log_tail(job: submitit.Job) -> str:
    """What the log of a job that left no result says: the last exception in it (a process that died of an
    exception submitit did not record), else its last line (a killed process's last words)."""
    try:
        text = job.paths.stderr.read_text(errors="replace")
    except OSError:
        return f" (no log at {job.paths.stderr})"
    found = exception_line(text)
    if found is not None:
        return f"; its log's last exception: {found!r} ({job.paths.stderr})"
    lines = [line for line in text.splitlines() if line.strip()]
    return (
        f"; its log ends: {lines[-1].strip()!r} ({job.paths.stderr})" if lines else f" (empty log {job.paths.stderr})"
    )

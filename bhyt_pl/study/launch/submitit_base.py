"""The study's runs as submitit jobs: the machinery every submitit executor shares (``SubmititLauncher``).

``SubmititLauncher`` implements the study's ``Launcher`` (``bhyt_pl.study.launch.launcher``) on submitit
(https://github.com/facebookincubator/submitit), the SLURM launcher of Hydra and of many research codebases. It is
a base: ``SlurmLauncher`` (``bhyt_pl.study.launch.slurm``, ``--launcher slurm``) and ``LocalJobLauncher``
(``bhyt_pl.study.launch.submitit_local``, ``--launcher local``) say how jobs are made, batched and observed.

- ``start(specs)`` submits the runs as one job array (``executor.map_array``), throttled so that at most
  ``max_concurrent`` runs of the study run at once, and records every job in the study folder
  (``job_records``: label, job id, try number, time) before it returns. The jobs are named after the study:
  SLURM gives every task of an array the array's one name, so a run's label is in the record and in the job's
  submitted pickle (``<study>/jobs/<job id>/``), not in the job name.
- ``poll(timeout)`` reads the jobs' states (``job_states``: ``sacct`` on SLURM, the controller process locally)
  and each job's result file every second. A job's result is the run's ``RunResult``; an exception in the job,
  a result with ``status == "error"``, a job that ended without a result, and a lost job (no accounting entry
  and no result for ``lost_after_s``; submitit would wait on it forever, as ``UNKNOWN``) each fail one try. A
  failed run is submitted again, up to ``retries`` more tries, and reported ``FAILED`` only when its tries are
  spent, with every try's error. A job's result file counts first, whatever its state says.
- A new launcher on the same folder carries on from the record: it collects runs whose jobs finished,
  re-attaches to jobs still queued or running, resubmits failed ones that have tries left, and never submits a
  run twice. A job submitted by a driver that died before recording it (an orphan) is found by its folder
  under ``<study>/jobs/`` and adopted.
- ``close()`` leaves queued and running jobs to a later driver; ``cancel()`` stops them (``scancel``).

Inside a job the run is a ``CheckpointableRun`` (``bhyt_pl.study.launch.submitit_job``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import submitit
from submitit.core.utils import DelayedSubmission, FailedJobError, FailedSubmissionError

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.cluster_settings import ClusterSettings
from bhyt_pl.study.launch.job_logs import job_error, log_tail
from bhyt_pl.study.launch.job_records import Event, JobRecord, JobRecords, SpecData, spec_dict
from bhyt_pl.study.launch.job_states import JobPhase
from bhyt_pl.study.launch.launcher import RunEvent, RunState
from bhyt_pl.study.launch.submitit_job import CheckpointableRun
from bhyt_pl.study.protocol.spec import RunStatus

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunResult, RunSpec

__all__ = ["SubmititLauncher"]

_STUDY_NAME = re.compile(r"[\w.@:+=/-]+")

log = logging.getLogger(__name__)


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

    A subclass per submitit executor provides the hooks: ``settings_class``, ``interrupted_runs``,
    ``_make_executor``, ``_job_function``, ``_job``, ``_batch``, ``_states_due``, ``_job_states`` and ``_phase``.

    Args:
        settings: resources, throttle, retries and timings (the subclass's ``settings_class``).
        folder: the study folder, on a filesystem the jobs share: the record ``jobs.jsonl`` and submitit's
            ``jobs/<job id>/`` folders (pickles, logs) go there.
        study: the study's name: the jobs' name (``squeue --name``, ``scancel --name``).
        run: the run function, ``RunSpec -> RunResult``, picklable (it is sent to the jobs).

    Raises:
        UsageError: another driver holds the folder, the study name is not a job name, or the executor cannot
            submit here (SLURM's tools missing).

    Example:
        >>> launcher = SlurmLauncher(SlurmSettings(partition="gpu"), Path("out"), "depth", run)  # doctest: +SKIP
        >>> launcher.start(specs)  # doctest: +SKIP
        >>> while pending: events = launcher.poll(60)  # doctest: +SKIP
    """

    settings_class: ClassVar[type[ClusterSettings]] = ClusterSettings
    """The settings this executor applies."""
    interrupted_runs: ClassVar[str] = ""
    """What becomes of the study's jobs when its driver is interrupted (the driver's last line)."""

    def __init__(
        self, settings: ClusterSettings, folder: Path, study: str, run: Callable[[RunSpec], RunResult]
    ) -> None:
        if not isinstance(settings, self.settings_class):
            raise TypeError(
                f"{type(self).__name__} needs {self.settings_class.__name__}, got {type(settings).__name__}"
            )
        if not _STUDY_NAME.fullmatch(study):
            raise UsageError(
                f"study name {study!r} is not a job name: use letters, digits and . _ - / @ : + = (no spaces or |)"
            )
        self.settings, self.folder, self.study = settings, Path(folder).absolute(), study
        self.executor = self._make_executor(self.folder / "jobs" / "%j")
        self.executor.update_parameters(**settings.executor_parameters(study))
        self.function = self._job_function(run)
        self.records = JobRecords(self.folder)
        self.records.lock()
        self._history = self.records.read()
        self._runs: dict[str, _Run] = {}
        self._pending: list[_Run] = []
        self._events: list[RunEvent] = []
        self._last_state_read = -math.inf  # when the jobs' states were last read
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
            self._last_state_read = -math.inf  # ask at once
        elif len(run.failures) > self.settings.retries:
            self._report(run, RunState.FAILED, error=self._failure_text(run))
        else:
            self._pending.append(run)
            self._report(run, RunState.QUEUED)

    def _has_ended(self, job_id: str) -> bool:
        """Whether a recorded job is over: it left a result, or its state says it ended or is no longer known."""
        job = self._job(job_id)
        if job.paths.result_pickle.exists():
            return True
        states = self._job_states([job])
        if states is None:
            return False  # no answer: it may still run
        return self._phase(states.get(job_id, "")).is_over

    def _find_orphans(self) -> dict[str, list[tuple[str, SpecData]]]:
        """Job folders with a submitted pickle and no record: label -> (job id, spec), oldest first.

        submitit writes ``jobs/<id>/<id>_submitted.pkl`` as soon as ``sbatch`` answers, before this launcher
        can record the job, so a driver killed in between leaves such a folder.
        """
        known = {record.job_id for record in self._history}
        root = self.folder / "jobs"
        orphans: dict[str, list[tuple[str, SpecData]]] = {}
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
        count, throttle = self._batch(free, len(self._pending))
        batch = self._pending[:count]
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
        self._last_state_read = -math.inf
        log.info("study: submitted %d run(s) as %s", count, f"array {array} (%{throttle})" if array else "job(s)")

    # -- observing
    def _refresh(self) -> None:
        active = [run for run in self._runs.values() if run.current is not None and run.final is None]
        now = time.time()
        states = None
        if active and self._states_due(now):
            states = self._job_states([run.current.job for run in active])  # type: ignore[union-attr]
            self._last_state_read = now
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
        if states is None:
            return  # no news of the states this time
        state = states.get(job.job_id, "")
        phase = self._phase(state)
        if phase == JobPhase.MISSING:
            attempt.missing_since = attempt.missing_since or now
            if now - attempt.missing_since >= self.settings.lost_after_s:
                job.cancel(check=False)  # should it reappear, it must not run beside its replacement
                self._fail(run, f"lost: no accounting entry and no result for {self.settings.lost_after_s:g} s")
            return
        attempt.missing_since = None
        if phase == JobPhase.ENDED:
            attempt.ended_since = attempt.ended_since or now
            if now - attempt.ended_since >= self.settings.result_wait_s:
                self._fail(run, f"the job ended ({state}) without a result{log_tail(job)}")
            return
        attempt.ended_since = None
        if phase == JobPhase.RUNNING:
            self._report(run, RunState.RUNNING)
        else:
            if phase == JobPhase.UNKNOWN:
                log.warning("job %s: unknown SLURM state %r, taken as queued", job.job_id, state)
            self._report(run, RunState.QUEUED)

    def _collect(self, run: _Run) -> None:
        assert run.current is not None
        try:
            result = run.current.job.result()
        except Exception as exc:  # noqa: BLE001 - an exception in the job fails this try
            self._fail(run, job_error(exc, run.current.job))
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

    # -- the executor (the subclass's hooks)
    def _make_executor(self, folder: Path) -> submitit.Executor:
        """submitit's executor of this study's jobs, writing to ``folder`` (a ``%j`` template)."""
        raise NotImplementedError

    def _job_function(self, run: Callable[[RunSpec], RunResult]) -> CheckpointableRun:
        """The callable each job runs: ``run``, checkpointable, with half the signal delay to stop at a step end."""
        return CheckpointableRun(run, self.settings.cpus_per_task, self.settings.signal_delay_s / 2)

    def _job(self, job_id: str) -> submitit.Job:
        """submitit's handle on a job of this study, from its id alone (a later driver's re-attachment)."""
        raise NotImplementedError

    def _batch(self, free: float, pending: int) -> tuple[int, int]:
        """How many of the ``pending`` runs to submit now, with ``free`` slots under ``max_concurrent``, and the
        batch's throttle (runs of it that may run at once); sets the executor's throttle where it has one."""
        raise NotImplementedError

    def _states_due(self, now: float) -> bool:
        """Whether to read the jobs' states now (``_last_state_read``: when they were last read)."""
        return True

    def _job_states(self, jobs: Sequence[submitit.Job]) -> dict[str, str] | None:
        """Each job's state word (absent: the scheduler does not know it), or None when there was no answer."""
        raise NotImplementedError

    def _phase(self, state: str) -> JobPhase:
        """What a state word of ``_job_states`` (``""``: none) means."""
        raise NotImplementedError


def _job_sort_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("_"))

"""A failed job's one-line reason (``bhyt_pl.study.launch.job_logs``): the exception submitit recorded, else what
the job's log says, never a warning printed after the traceback."""

from __future__ import annotations

from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError

from bhyt_pl.study.launch.job_logs import exception_line, job_error, log_tail

LEAFSPEC = "UserWarning: LeafSpec is deprecated (a warning printed last, not the cause)"
TRACE = f"""Traceback (most recent call last):
  File "job.py", line 3, in run
    raise ValueError(message)
ValueError: first line of the message
second line
{LEAFSPEC}
"""


def test_a_failed_jobs_reason_is_its_exception_and_the_log_only_without_one(tmp_path: Path) -> None:
    job = submitit.LocalJob(folder=tmp_path / "%j", job_id="42")
    recorded = FailedJobError(f"Job (task=0) failed during processing with trace:\n----------------------\n{TRACE}"
                              "\n----------------------\nYou can check full logs with 'job.stderr(0)'")  # fmt: skip
    assert job_error(recorded, job) == f"ValueError: first line of the message (log: {job.paths.stderr})"
    assert exception_line(TRACE) == "ValueError: first line of the message"
    assert exception_line(f"{LEAFSPEC}\n") is None
    job.paths.stderr.parent.mkdir(parents=True)
    job.paths.stderr.write_text(f"starting\n{TRACE}")  # a process that died of an exception nobody recorded
    assert log_tail(job) == f"; its log's last exception: 'ValueError: first line of the message' ({job.paths.stderr})"
    job.paths.stderr.write_text(f"step 3\n{LEAFSPEC}\n")  # killed: no exception anywhere, the last line it is
    assert log_tail(job) == f"; its log ends: {LEAFSPEC!r} ({job.paths.stderr})"


def test_no_log_and_an_empty_log_are_said_as_such(tmp_path: Path) -> None:
    job = submitit.LocalJob(folder=tmp_path / "%j", job_id="7")
    assert log_tail(job) == f" (no log at {job.paths.stderr})"
    job.paths.stderr.parent.mkdir(parents=True)
    job.paths.stderr.write_text("\n \n")
    assert log_tail(job) == f" (empty log {job.paths.stderr})"
    assert job_error(RuntimeError(), job) == f"RuntimeError (log: {job.paths.stderr})"  # no message: its type

"""Why a submitit job failed, in one line for the study's report: the exception it raised, or what its log says.

submitit records a job's exception with its whole traceback; a job that died without a result (killed, or an
exception submitit did not record) leaves only its log. The study reports one line per failed try.
"""

from __future__ import annotations

import submitit
from submitit.core.utils import FailedJobError

__all__ = ["exception_line", "job_error", "log_tail"]

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


def job_error(exc: Exception, job: submitit.Job) -> str:
    """The exception the job raised (its type and message, from the traceback submitit recorded), and where the
    job's log is."""
    text = str(exc)
    if isinstance(exc, FailedJobError) and "----------------------" in text:
        text = text.split("----------------------")[1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = exception_line(text) or (lines[-1] if lines else type(exc).__name__)
    return f"{line} (log: {job.paths.stderr})"


def log_tail(job: submitit.Job) -> str:
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

"""The study folder's record of its cluster jobs: which run went to which job, on which try, and how each try ended.

A cluster study outlives its driver: the driver may be killed between any two lines, and the next one must
find every job the last one submitted from the folder alone (it sits on the shared filesystem, next to the
runs). The record is append-only JSON lines in ``<study>/jobs.jsonl``, one line per event:

- ``submitted``: a run's try went to a job (the run's label and spec, the job id, the try number, the job
  array and its throttle);
- ``done``: the try returned a result the study keeps;
- ``failed``: the try failed (its error), or was lost;
- ``cancelled``: the driver cancelled the try (``SubmititLauncher.cancel``).

Each ``append`` is one ``write`` of whole lines followed by ``fsync``: a crash loses at most the line being
written, and ``read`` drops a torn last line. Only one driver may write a folder at a time (``lock``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias, cast

from bhyt_pl.errors import UsageError

if TYPE_CHECKING:
    from bhyt_pl.study.protocol.spec import RunSpec

__all__ = ["RECORDS_FILE", "Event", "JobRecord", "JobRecords", "JsonValue", "SpecData", "spec_dict"]

RECORDS_FILE = "jobs.jsonl"
"""The record's name in the study folder."""

LOCK_FILE = "jobs.lock"

Event = Literal["submitted", "done", "failed", "cancelled"]

JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"
SpecData = dict[str, JsonValue]
"""A ``RunSpec`` as the record stores it: JSON data (tuples read back as lists)."""


def spec_dict(spec: RunSpec) -> SpecData:
    """The spec as plain JSON data: what the record stores and compares (tuples read back as lists)."""
    return cast(SpecData, json.loads(json.dumps(asdict(spec), default=str)))


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRecord:
    """One line of the record.

    Args:
        event: what happened to the try (module docstring).
        label: the run's label.
        job_id: the cluster's id of the try's job (``<array>_<index>`` for an array task, a process id for
            the local executor).
        attempt: the try number, from 1.
        time: when it was recorded (Unix seconds).
        spec: the run's ``RunSpec`` as a dict (``submitted`` only): a later driver checks it is the same run.
        array: the id of the job array the try was submitted in (``submitted`` only).
        throttle: how many tasks of that array may run at once (``submitted`` only).
        error: why the try failed (``failed`` only).
    """

    event: Event
    label: str
    job_id: str
    attempt: int
    time: float
    spec: SpecData | None = None
    array: str | None = None
    throttle: int | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, default=str)


class JobRecords:
    """The append-only record in a study folder (module docstring).

    Example:
        >>> import tempfile, time
        >>> records = JobRecords(Path(tempfile.mkdtemp()))
        >>> records.append([JobRecord("submitted", "rmsnorm@lr0.003-steps180-s1", "4242_0", 1, time.time())])
        >>> [r.job_id for r in records.read()]
        ['4242_0']
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / RECORDS_FILE
        self._lock_fd: int | None = None

    def append(self, records: Iterable[JobRecord]) -> None:
        """Adds the records, durably, before returning: one write of whole lines, then ``fsync``."""
        text = "".join(record.to_json() + "\n" for record in records)
        if not text:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            data = text.encode()
            while data:  # a regular file takes the whole buffer at once; loop only for a short write
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[JobRecord]:
        """Every record in order. A torn last line (a crash mid-write) is dropped; a bad line elsewhere is an error."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(JobRecord(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                if number == len(lines):
                    log.warning("%s: ignoring its torn last line (a driver stopped while writing it)", self.path)
                    continue
                raise UsageError(
                    f"{self.path}, line {number}: not a job record ({exc}); fix or remove the line"
                ) from exc
        return records

    def lock(self) -> None:
        """Claims the folder for this driver: two drivers on one study would submit its runs twice.

        Raises:
            UsageError: another live driver holds the folder (its host and process id are named).
        """
        if self._lock_fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel if this driver dies
        except OSError as exc:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UsageError(
                f"another study driver ({holder}) is using {self.folder}; stop it first, or use another study folder"
            ) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Releases the folder (``lock``)."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

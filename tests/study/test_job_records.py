"""The study folder's job record: append-only JSON lines that survive a driver killed mid-write, and the
lock that keeps a second driver off the folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bhyt_pl.errors import UsageError
from bhyt_pl.study.launch.job_records import LOCK_FILE, RECORDS_FILE, JobRecord, JobRecords


def test_records_are_appended_durably_and_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    store = JobRecords(tmp_path)
    store.append([JobRecord("submitted", "a", "7_0", 1, 1.0, spec={"label": "a"}, array="7", throttle=2)])
    store.append([JobRecord("failed", "a", "7_0", 1, 2.0, error="lost")])
    with open(store.path, "a") as f:
        f.write('{"event": "done", "lab')  # a driver killed mid-write
    assert [(r.event, r.job_id, r.error) for r in store.read()] == [
        ("submitted", "7_0", None),
        ("failed", "7_0", "lost"),
    ]
    lines = store.path.read_text().splitlines()
    store.path.write_text("\n".join([lines[0], "not json", lines[1]]) + "\n")
    with pytest.raises(UsageError, match=f"{RECORDS_FILE}, line 2: not a job record"):
        store.read()


def test_a_line_holds_only_the_fields_its_event_has_and_reads_back_equal(tmp_path: Path) -> None:
    submitted = JobRecord("submitted", "bhyt@lr0.003-steps180-s1", "12_3", 2, 5.5, spec={"seed": 1}, array="12")
    done = JobRecord("done", "bhyt@lr0.003-steps180-s1", "12_3", 2, 6.5)
    store = JobRecords(tmp_path / "study")  # the folder is made on the first append
    assert store.read() == []
    store.append([submitted, done])
    store.append([])  # nothing to write: the file is left as it is
    lines = [json.loads(line) for line in store.path.read_text().splitlines()]
    assert lines[1] == {
        "event": "done",
        "label": "bhyt@lr0.003-steps180-s1",
        "job_id": "12_3",
        "attempt": 2,
        "time": 6.5,
    }
    assert set(lines[0]) == {"event", "label", "job_id", "attempt", "time", "spec", "array"}
    assert store.read() == [submitted, done]


def _try_lock(folder: Path) -> int:
    """Takes the folder's lock from another process (flock is per open file, so only another one tells): 0 when
    it got it, 3 when the lock is held."""
    code = (
        "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(3)\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(folder / LOCK_FILE)], timeout=60).returncode


def test_one_driver_holds_the_folder_and_the_lock_names_it_until_released(tmp_path: Path) -> None:
    store = JobRecords(tmp_path)
    store.lock()
    store.lock()  # a second call by the same driver is a no-op
    assert f"pid {os.getpid()} on " in (tmp_path / LOCK_FILE).read_text()
    assert _try_lock(tmp_path) == 3  # held against every other process
    with pytest.raises(UsageError, match=rf"another study driver \(pid {os.getpid()} on .*\) is using"):
        JobRecords(tmp_path).lock()  # a second driver is told who holds the folder
    store.unlock()
    assert _try_lock(tmp_path) == 0  # released: the next driver takes it

"""A checkpoint save that failed for lack of disk space, named as such: ``DiskFull`` (an ``OSError`` with errno
``ENOSPC``, or ``EDQUOT`` for a quota) carrying the checkpoint path and about how much the checkpoint needs, so
that the command line says ``No space left on device``, the path and the free space, and exits with status 2.

torch often hides the errno. Its zip writer, given a path (Lightning's ``meta.pt`` of a sharded save), writes
from C++ and reports a refused write as ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected
pos 704 vs 598``; given a Python file (``AtomicCheckpointIO``), it raises that error in place of the
``OSError``, which survives only as its context; and a distributed-checkpoint save hands every rank the
failures of all ranks, pickled, without their causes or contexts. ``save_disk_full`` therefore looks for the
errno first and otherwise at the free space left when the save failed (its rule is in its docstring).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.errors import exception_chain

__all__ = ["DISK_FULL_ERRNOS", "DiskFull", "bytes_at", "disk_full_in", "free_bytes", "payload_bytes",
           "save_disk_full"]  # fmt: skip

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""No space left on the device, and a disk quota exceeded (the usual form of a full disk on a shared cluster)."""
_SLACK_BYTES = 2**20
_SLACK_FRACTION = 0.01
"""What a checkpoint writes beyond its tensors, as a share of them: the pickled trainer state, zip and shard
headers, ``.metadata``, file-system blocks (``save_disk_full``)."""


class DiskFull(OSError):
    """A checkpoint save refused for lack of space: ``errno`` is ``ENOSPC`` or ``EDQUOT``, ``filename`` the
    checkpoint being saved, ``needed`` about how many bytes it takes and ``free`` the bytes free when the save
    failed, its partial output still on disk (None when unknown)."""

    def __init__(self, code: int, path: str | Path, needed: int | None = None, free: int | None = None) -> None:
        super().__init__(code, os.strerror(code), str(path))
        self.needed, self.free = needed, free

    def __reduce__(self) -> tuple[Any, ...]:  # OSError's would call __init__ with (errno, strerror, filename)
        return type(self), (self.errno, self.filename, self.needed, self.free)


def disk_full_in(err: BaseException) -> OSError | None:
    """The ``OSError`` in ``err``'s chain whose errno says the disk is full (``DISK_FULL_ERRNOS``), or None."""
    for exc in exception_chain(err):
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
    return None


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to this user on the file system of ``path`` (its nearest existing folder), None when unknown."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def bytes_at(path: str | Path) -> int:
    """The size of a file, or of every file in a folder; 0 when missing."""
    path = Path(path)
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size if path.is_file() else 0
    except OSError:  # a file removed while counting
        return 0


def payload_bytes(obj: Any) -> int:
    """The bytes of every tensor in a checkpoint dict (nested dicts, lists and tuples), as a save writes them;
    a DTensor counts its global size (a sharded save writes every shard of it)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


def save_disk_full(err: BaseException, path: str | Path, written_to: str | Path, needed: int) -> DiskFull | None:
    """``err``, the failure of a save of the checkpoint ``path``, as a ``DiskFull`` (caused by ``err``) when the
    disk is full; None when it is something else. Call it before removing the partial output at ``written_to``
    (the temporary file or folder); ``needed`` is about how many bytes the whole checkpoint takes.

    The rule: an errno of ``DISK_FULL_ERRNOS`` anywhere in the chain says so. Without one (module docstring:
    torch's writer drops it), look at the free space on ``written_to``'s file system now, while the partial
    output still occupies its share: a write refused for lack of space leaves less free space than what the save
    still had to write, ``needed`` minus the bytes already at ``written_to``. Since ``needed`` counts the
    tensors only, the test allows a slack for the rest (1 MiB plus 1 % of ``needed``): the disk is taken as full
    when the free space is below that remainder plus the slack. A failure with more room than that (a broken
    file system, a bug) keeps its own error."""
    found = disk_full_in(err)
    if isinstance(found, DiskFull):
        return found
    free = free_bytes(written_to)
    if found is None:
        remaining = max(needed - bytes_at(written_to), 0)
        if free is None or free >= remaining + _SLACK_BYTES + _SLACK_FRACTION * needed:
            return None
    full = DiskFull(errno.ENOSPC if found is None else found.errno, path, needed, free)
    full.__cause__ = err  # the traceback in train.log keeps the writer's error
    return full

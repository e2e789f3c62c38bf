"""Checkpoints on disk: atomic writes of single-file and sharded checkpoints, the check that tells a complete
checkpoint from an interrupted one, the cleanup of what an interrupted save left behind, and consolidation of a
sharded (FSDP2 / distributed-checkpoint) folder into one file. (Formerly ``bhyt_pl.distributed``, which remains
as an alias.)

How each kind of save is made atomic (docs/checkpoints.md says what a rename guarantees on local disks, NFS
and Lustre):

- a single file is written to ``.<name>.<8 random characters>.tmp`` beside its target, flushed to disk and
  renamed over the target (``AtomicCheckpointIO``);
- a sharded checkpoint is a folder that every rank writes its shards into. ``RunCheckpoint`` has it written to
  ``.<name>.step<N>.tmp``, the same name on every rank; rank 0 then checks it, writes the completion marker
  ``.complete`` (the step and every file's size), flushes the marker and the folder, and moves the folder into
  place (``commit_sharded_checkpoint``). A folder cannot be renamed over a non-empty one, so the previous
  checkpoint first moves aside to ``.<name>.previous`` and is deleted only once the new one is in place;
  ``--ckpt_path last`` finds it there in between.

A sharded folder written before the marker existed is accepted when every file and byte range its
``.metadata`` names exists and its ``meta.pt`` loads (``sharded_checkpoint_problem``).

``python -m bhyt_pl consolidate runs/x/version_0/checkpoints/last.ckpt last-full.ckpt`` turns a sharded
checkpoint folder into a single ``LlamaLM`` checkpoint that ``bhyt_pl.load_model`` and ``--ckpt_path``
read in one process; it refuses an incomplete folder and names the newest complete one beside it.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy
from typing_extensions import override

from bhyt_pl.disk_full import payload_bytes, save_disk_full
from bhyt_pl.errors import UsageError

__all__ = [
    "COMPLETE",
    "AtomicCheckpointIO",
    "checkpoint_problem",
    "checkpoint_step",
    "commit_sharded_checkpoint",
    "complete_checkpoints",
    "consolidate_checkpoint",
    "human_size",
    "kept_path",
    "kept_target",
    "leftovers",
    "load_sharded_checkpoint",
    "main",
    "newest_complete_beside",
    "remove_checkpoint_path",
    "remove_leftovers",
    "saves_sharded",
    "sharded_checkpoint_problem",
    "switch_into_place",
    "temporary_path",
    "unusable_checkpoint_message",
]

COMPLETE = ".complete"
"""Completion marker of a sharded checkpoint folder: JSON with the step and the size of every other file,
written by rank 0 after every rank has written its shards."""
DCP_METADATA = ".metadata"
"""The distributed checkpoint's index of tensors, shards and byte ranges (torch writes it last, by rename)."""
TRAINER_STATE = "meta.pt"
"""Lightning's non-tensor state in a sharded folder: loops, callbacks, hyperparameters, ``bhyt_pl`` entry."""
_KEPT = ".previous"
_LEFTOVER = re.compile(r"\.(?P<target>.+)\.(?:[a-z0-9_]{8}|step\d+)\.tmp")
"""``.<name>.<random>.tmp`` (``tempfile.mkstemp``, single files) and ``.<name>.step<N>.tmp`` (sharded folders)."""


# ----------------------------------------------------------------------------- names
def temporary_path(target: str | Path, step: int) -> Path:
    """Where a sharded save of ``target`` at ``step`` is written before it moves into place: named after the
    step, so every rank computes the same path."""
    target = Path(target)
    return target.with_name(f".{target.name}.step{step}.tmp")


def kept_path(target: str | Path) -> Path:
    """Where the previous checkpoint waits while a new sharded ``target`` moves into place."""
    target = Path(target)
    return target.with_name(f".{target.name}{_KEPT}")


def kept_target(path: str | Path) -> Path | None:
    """The checkpoint a kept copy (``kept_path``) belongs to, None for any other path."""
    path = Path(path)
    if path.name.startswith(".") and path.name.endswith(f".ckpt{_KEPT}"):
        return path.with_name(path.name[1 : -len(_KEPT)])
    return None


def saves_sharded(strategy: Strategy) -> bool:
    """True when ``strategy`` writes checkpoints as folders of shards (FSDP2's ``ModelParallelStrategy`` by
    default, FSDP1 with ``state_dict_type="sharded"``) instead of one file through its ``CheckpointIO``."""
    # Lightning keeps both choices in private attributes; its own save_checkpoint branches on them the same way
    if isinstance(strategy, ModelParallelStrategy):
        return bool(strategy._save_distributed_checkpoint)
    if isinstance(strategy, FSDPStrategy):
        return strategy._state_dict_type == "sharded"
    return False


def human_size(n: float) -> str:
    """``22.4 MB``: decimal units, as ``df -H`` prints them."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# ----------------------------------------------------------------------------- writing
class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file in the target folder, flushes it to disk, then
    renames it over the target, so a process killed during a save leaves the previous ``last.ckpt``
    intact and never a truncated one. (Lightning's ``TorchCheckpointIO`` writes the target in place.)
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
            if path.is_dir():  # a sharded checkpoint of an earlier run under another strategy
                switch_into_place(Path(tmp), path)
            else:
                os.replace(tmp, path)  # atomic on POSIX within one filesystem
                _fsync_dir(path.parent)
        except BaseException as err:
            # before the partial file is removed: torch's writer may hide the errno (``save_disk_full``)
            full = save_disk_full(err, path, tmp, payload_bytes(checkpoint)) if isinstance(err, Exception) else None
            Path(tmp).unlink(missing_ok=True)
            if full is not None and full is not err:
                raise full from err
            raise


def switch_into_place(new: Path, target: Path) -> None:
    """Move the complete checkpoint ``new`` (a file or folder beside ``target``) to ``target``, keeping the
    previous one at ``kept_path(target)`` until the new one is in place.

    ``rename`` replaces a file atomically but not a non-empty folder, hence two renames; every moment of the
    switch leaves a complete checkpoint under ``target`` or its kept name (``--ckpt_path last`` looks at both)."""
    kept = kept_path(target)
    if target.exists() or target.is_symlink():
        if kept.exists():  # kept by an earlier switch that stopped before deleting it: target is newer
            remove_checkpoint_path(kept)
        os.rename(target, kept)
    os.rename(new, target)
    _fsync_dir(target.parent)
    if kept.exists():
        remove_checkpoint_path(kept)


def commit_sharded_checkpoint(folder: Path, target: Path, step: int) -> None:
    """Rank 0's half of an atomic sharded save, once every rank has written its shards into ``folder``: check it,
    write the completion marker, flush the marker, the trainer state and the folder to disk, and switch the
    folder into place at ``target`` (``switch_into_place``)."""
    problem = sharded_checkpoint_problem(folder, require_marker=False)
    if problem is not None:
        raise OSError(errno.EIO, f"the sharded checkpoint written to {folder} is incomplete: {problem}")
    _fsync_file(folder / TRAINER_STATE)  # Lightning writes it with torch.save, without a flush to disk
    files = {p.name: _opened_size(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != COMPLETE}
    with open(folder / COMPLETE, "x") as f:
        json.dump({"step": step, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(folder)
    switch_into_place(folder, target)


def remove_checkpoint_path(path: Path) -> None:
    """Delete a checkpoint file or folder (missing is fine)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename, a new file) to disk: ``fsync`` on a file does not (fsync(2))."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):  # a filesystem that cannot sync folders
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------- checking
def sharded_checkpoint_problem(folder: str | Path, require_marker: bool = False) -> str | None:
    """What makes the sharded checkpoint ``folder`` incomplete, in a few words, or None when it is complete.

    Cheap: reads ``.metadata`` and ``meta.pt`` and the sizes of the shards, never the tensors. Every file and
    byte range ``.metadata`` names must exist and ``meta.pt`` must load; when the completion marker is there
    (every folder written by ``RunCheckpoint``), every file must also have the size it recorded. A folder
    without the marker (written in place before it existed) is accepted on the first two checks unless
    ``require_marker``."""
    folder = Path(folder)
    marker = folder / COMPLETE
    recorded: dict[str, int] = {}
    if marker.is_file():
        try:
            recorded = dict(json.loads(marker.read_text())["files"])
        except (ValueError, KeyError, TypeError, OSError) as err:
            return f"its completion marker {COMPLETE} cannot be read ({_one_line(err)})"
    elif require_marker:
        return f"no completion marker {COMPLETE}: the save did not finish"
    for name, size in sorted(recorded.items()):
        found = _opened_size(folder / name)
        if found is None:
            return f"{name} is missing"
        if found != size:
            return f"{name} has {human_size(found)}, its save wrote {human_size(size)}"
    if not (folder / DCP_METADATA).is_file():
        return f"no {DCP_METADATA}: the save did not finish"
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as err:  # a truncated or foreign pickle: any failure means the same to the user
        return f"its {DCP_METADATA} cannot be read ({_one_line(err)})"
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():  # _StorageInfo: relative_path, offset, length
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        size = _opened_size(folder / name)
        if size is None:
            return f"shard {name} is missing"
        if size < end:
            return f"shard {name} is truncated ({human_size(size)} of the {human_size(end)} {DCP_METADATA} names)"
    state = folder / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE} (the trainer state): the save did not finish"
    try:
        torch.load(state, map_location="cpu", weights_only=False)
    except Exception as err:
        return f"its {TRAINER_STATE} cannot be read ({_one_line(err)})"
    return None


def _opened_size(path: Path) -> int | None:
    """A file's size read through an open file (None when missing): on NFS, opening a file revalidates its
    attributes with the server (close-to-open consistency), so rank 0 sees what the other nodes wrote."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size
    except (FileNotFoundError, IsADirectoryError):
        return None


_ZIP_MAGIC = b"PK\x03\x04"
"""First bytes of torch's zip checkpoint format; a legacy (pre-1.6) pickle starts with ``\\x80``."""


def checkpoint_problem(path: str | Path) -> str | None:
    """What makes ``path`` unusable as a checkpoint (a file or a sharded folder), or None. Cheap: a file's
    header and zip directory (the last bytes written), a folder's ``sharded_checkpoint_problem``."""
    path = Path(path)
    if path.is_dir():
        return sharded_checkpoint_problem(path)
    if not path.is_file():
        return "it does not exist"
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"\x80"):
        return None  # torch's legacy format has no cheap completeness check
    if not head.startswith(_ZIP_MAGIC):
        return "not in torch's checkpoint format"
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError) as err:
        return f"the file is truncated or damaged ({_one_line(err)})"
    return None


def checkpoint_step(path: str | Path) -> int | None:
    """The global step a checkpoint was saved at (None when it does not say or cannot be read): a sharded
    folder's marker or ``meta.pt``, a file's ``global_step`` (memory-mapped: its tensors are not read)."""
    path = Path(path)
    try:
        if path.is_dir():
            if (path / COMPLETE).is_file():
                return int(json.loads((path / COMPLETE).read_text())["step"])
            return int(torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=False)["global_step"])
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])
    except Exception:  # the step only labels a checkpoint in messages; an unreadable one has none
        return None


def _checkpoint_entries(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``: ``*.ckpt`` files and folders, and kept copies; never temporaries."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p.suffix == ".ckpt" and not p.name.startswith(".")) or kept_target(p))


def complete_checkpoints(folder: str | Path) -> list[tuple[Path, int | None]]:
    """The complete checkpoints in a checkpoint folder with their steps, newest step first."""
    found = [(p, checkpoint_step(p)) for p in _checkpoint_entries(Path(folder)) if checkpoint_problem(p) is None]
    return sorted(found, key=lambda item: (item[1] is not None, item[1] or 0, item[0].stat().st_mtime), reverse=True)


def newest_complete_beside(path: str | Path) -> tuple[Path, int | None] | None:
    """The newest complete checkpoint in the folder of ``path``, other than ``path`` itself."""
    path = Path(path)
    for other, step in complete_checkpoints(path.parent):
        if other != path:
            return other, step
    return None


def unusable_checkpoint_message(path: str | Path, problem: str) -> str:
    """One line: the checkpoint, what is wrong with it, and the newest complete checkpoint to use instead."""
    path = Path(path)
    other = newest_complete_beside(path)
    if other is None:
        instead = "no complete checkpoint is beside it"
    else:
        step = f" (step {other[1]})" if other[1] is not None else ""
        instead = f"the newest complete checkpoint beside it is {str(other[0])!r}{step}"
    kind = "an incomplete checkpoint" if path.is_dir() else "not a checkpoint"
    return f"{str(path)!r} is {kind}: {problem}; {instead}"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


# ----------------------------------------------------------------------------- leftovers
def leftovers(folder: str | Path) -> list[Path]:
    """What interrupted saves left in a checkpoint folder: temporary files and folders of this module's
    writers, and a kept copy whose checkpoint is complete again (only these names; nothing else is touched)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        match = _LEFTOVER.fullmatch(path.name)
        if match is not None and match.group("target").endswith(".ckpt"):
            found.append(path)
        elif (target := kept_target(path)) is not None and checkpoint_problem(target) is None:
            found.append(path)  # the switch stopped after the new checkpoint was in place
    return found


def remove_leftovers(folder: str | Path, keep: Iterable[str | Path | None] = ()) -> tuple[list[Path], int]:
    """Delete ``leftovers(folder)`` except the paths in ``keep`` (the checkpoint a run resumes from); returns
    the deleted paths and the bytes they held."""
    kept = {Path(p).absolute() for p in keep if p}
    removed, size = [], 0
    for path in leftovers(folder):
        if path.absolute() in kept:
            continue
        size += sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
        remove_checkpoint_path(path)
        removed.append(path)
    return removed, size


# ----------------------------------------------------------------------------- consolidation
def load_sharded_checkpoint(folder: str | Path) -> dict[str, Any]:
    """One checkpoint dict (Lightning's single-file layout) from a complete distributed-checkpoint folder; an
    incomplete one is a ``UsageError`` naming what is wrong and the newest complete checkpoint beside it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    if not any((folder / name).exists() for name in (DCP_METADATA, TRAINER_STATE, COMPLETE)):
        if not any(folder.glob("*.distcp")):
            raise UsageError(f"{str(folder)!r} is not a sharded checkpoint folder (no {DCP_METADATA}, no shards)")
    problem = sharded_checkpoint_problem(folder)
    if problem is not None:
        raise UsageError(unusable_checkpoint_message(folder, problem))
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, Path(tmp) / "tensors.pt")
        tensors = torch.load(Path(tmp) / "tensors.pt", weights_only=False)
    checkpoint: dict[str, Any] = dict(torch.load(folder / TRAINER_STATE, weights_only=False))
    if "model" in tensors:
        tensors["state_dict"] = tensors.pop("model")
    optimizer_keys = sorted((k for k in tensors if re.fullmatch(r"optimizer_\d+", k)), key=lambda k: int(k[10:]))
    if optimizer_keys:
        checkpoint["optimizer_states"] = [tensors.pop(k) for k in optimizer_keys]
    checkpoint.update(tensors)
    return checkpoint


def consolidate_checkpoint(folder: str | Path, output: str | Path) -> Path:
    """Write the single-file equivalent of a complete sharded checkpoint folder (atomically) and return its path."""
    checkpoint = load_sharded_checkpoint(folder)
    AtomicCheckpointIO().save_checkpoint(checkpoint, output)
    return Path(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bhyt_pl consolidate",
        allow_abbrev=False,  # a shortened flag is an error, never read as the flag it starts
        description="Consolidate a sharded (FSDP2 / distributed) checkpoint folder into one .ckpt file. An "
        "incomplete folder (an interrupted save) is refused, naming the newest complete checkpoint beside it.",
    )
    parser.add_argument("folder", help="the checkpoint folder, e.g. runs/llama-3b-bhyt/version_0/checkpoints/last.ckpt")
    parser.add_argument("output", help="the single-file checkpoint to write")
    args = parser.parse_args(argv)
    path = consolidate_checkpoint(args.folder, args.output)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0

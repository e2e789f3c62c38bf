"""Checkpoint IO: atomic single-file writes (the CLI's default ``trainer.plugins``) and consolidation of
sharded (FSDP2 / distributed-checkpoint) folders into one file. (Formerly ``bhyt_pl.distributed``, which
remains as an alias.)

``python -m bhyt_pl consolidate runs/x/version_0/checkpoints/last.ckpt last-full.ckpt`` turns a sharded
checkpoint folder into a single ``LlamaLM`` checkpoint that ``bhyt_pl.load_model`` and ``--ckpt_path``
read in one process.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

__all__ = ["AtomicCheckpointIO", "consolidate_checkpoint", "load_sharded_checkpoint", "main"]


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
            os.replace(tmp, path)  # atomic on POSIX within one filesystem
        except BaseException as err:
            Path(tmp).unlink(missing_ok=True)
            if _is_disk_full(err):  # torch reports it as an opaque writer error with the OSError in its chain
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
            raise


def _is_disk_full(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        err = err.__cause__ or err.__context__
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load_sharded_checkpoint(folder: str | Path) -> dict[str, Any]:
    """One checkpoint dict (Lightning's single-file layout) from a distributed-checkpoint folder."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    if not (folder / ".metadata").exists():
        raise ValueError(f"{str(folder)!r} is not a distributed checkpoint folder (no .metadata file)")
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, Path(tmp) / "tensors.pt")
        tensors = torch.load(Path(tmp) / "tensors.pt", weights_only=False)
    checkpoint: dict[str, Any] = {}
    meta = folder / "meta.pt"  # Lightning's non-tensor state: loops, callbacks, hyperparameters, ...
    if meta.exists():
        checkpoint.update(torch.load(meta, weights_only=False))
    if "model" in tensors:
        tensors["state_dict"] = tensors.pop("model")
    optimizer_keys = sorted((k for k in tensors if re.fullmatch(r"optimizer_\d+", k)), key=lambda k: int(k[10:]))
    if optimizer_keys:
        checkpoint["optimizer_states"] = [tensors.pop(k) for k in optimizer_keys]
    checkpoint.update(tensors)
    return checkpoint


def consolidate_checkpoint(folder: str | Path, output: str | Path) -> Path:
    """Write the single-file equivalent of a sharded checkpoint folder (atomically) and return its path."""
    checkpoint = load_sharded_checkpoint(folder)
    AtomicCheckpointIO().save_checkpoint(checkpoint, output)
    return Path(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bhyt_pl consolidate",
        description="Consolidate a sharded (FSDP2 / distributed) checkpoint folder into one .ckpt file.",
    )
    parser.add_argument("folder", help="the checkpoint folder, e.g. runs/llama-3b-bhyt/version_0/checkpoints/last.ckpt")
    parser.add_argument("output", help="the single-file checkpoint to write")
    args = parser.parse_args(argv)
    path = consolidate_checkpoint(args.folder, args.output)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0

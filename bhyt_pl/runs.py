"""Where a run writes: ``<runs_dir>/<run_name>/version_N/`` holds its TensorBoard log, ``config.yaml``
and ``checkpoints/`` (``last.ckpt``); one run version is one folder and one TensorBoard curve.

- ``RunLogger`` claims the next ``version_N`` atomically (``mkdir`` either creates the folder or fails),
  so two runs started at the same instant never share a version. Under DDP/FSDP rank 0 claims it and
  ``RunCheckpoint`` broadcasts it to the other ranks.
- ``find_last_checkpoint`` is what ``--ckpt_path last`` means: the newest version's last checkpoint,
  falling back to the layout before versioned folders (``<run_name>/checkpoints/``).
- ``checkpoint_run_version`` tells which run version a checkpoint belongs to, so a resume continues in it.
- ``run_loggers`` completes a recipe's own ``trainer.logger`` (W&B, MLflow, CSV) with the run's folder and name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import TensorBoardLogger
from typing_extensions import override

from bhyt_pl.checkpoint_io import kept_target
from bhyt_pl.errors import UsageError

__all__ = [
    "RunLogger",
    "checkpoint_run_version",
    "claim_version",
    "discard_version",
    "find_last_checkpoint",
    "last_checkpoint_candidates",
    "run_loggers",
]

_VERSION = re.compile(r"version_(\d+)")
LAST = "last"
"""Stem of the last checkpoint (Lightning's ``ModelCheckpoint.CHECKPOINT_NAME_LAST``)."""


def _versions(run_dir: Path) -> list[int]:
    """Version numbers of the ``version_N`` folders under ``run_dir``, ascending."""
    if not run_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in run_dir.iterdir() if p.is_dir() and (m := _VERSION.fullmatch(p.name)))


def claim_version(run_dir: str | Path) -> int:
    """Create ``run_dir/version_N`` for the smallest N above every existing version and return N.

    ``os.mkdir`` is atomic: when two processes race for the same N, one creates it and the other moves on."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        versions = _versions(run_dir)
        version = versions[-1] + 1 if versions else 0
        while True:
            try:
                os.mkdir(run_dir / f"version_{version}")
                return version
            except FileExistsError:
                version += 1
            except FileNotFoundError:  # a failed run removed the then empty run folder (discard_version)
                run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # a file where a folder is needed
        raise UsageError(f"cannot create the run folder {str(run_dir)!r}: {err.filename} is a file; check --runs_dir")
    except OSError as err:  # read-only, no permission, quota, ...: found before any work
        raise UsageError(
            f"cannot create the run folder {str(run_dir)!r}: {err.strerror or err}; make --runs_dir writable "
            f"or choose another one"
        ) from None


def discard_version(run_dir: str | Path, version: int) -> bool:
    """Remove ``run_dir/version_N`` of a run that failed before its first step (a TensorBoard file and
    ``config.yaml``, no checkpoint), so failed attempts leave no orphan folder; True if removed. A folder
    holding a checkpoint is kept. ``run_dir`` itself goes too when nothing else is left in it (a failed first
    run of a name leaves no empty ``<run_name>/``)."""
    import shutil

    folder = Path(run_dir) / f"version_{version}"
    if not folder.is_dir() or any(folder.glob("checkpoints/*.ckpt")):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rmdir(run_dir)  # only when empty: another version, or a run claiming one, keeps it
    except OSError:
        pass
    return True


def _is_last(path: Path) -> bool:
    return path.suffix == ".ckpt" and re.fullmatch(rf"{LAST}(-v\d+)?", path.stem) is not None


def _newest_last(folder: Path) -> Path | None:
    """The most recently written ``last*.ckpt`` in a checkpoint folder (file, or folder when sharded). While a
    sharded save moves into place, ``last.ckpt`` is briefly absent and the previous one waits under its kept
    name (``bhyt_pl.checkpoint_io.switch_into_place``): that one is found then."""
    if not folder.is_dir():
        return None
    found = []
    for path in folder.iterdir():
        target = kept_target(path)
        if _is_last(path) or (target is not None and _is_last(target) and not target.exists()):
            found.append(path)
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def last_checkpoint_candidates(run_dir: str | Path) -> list[Path]:
    """The folders ``find_last_checkpoint`` searches, in order (for error messages and docs)."""
    run_dir = Path(run_dir)
    return [run_dir / f"version_{v}" / "checkpoints" for v in reversed(_versions(run_dir))] + [run_dir / "checkpoints"]


def find_last_checkpoint(run_dir: str | Path) -> Path | None:
    """The last checkpoint of the newest run version under ``run_dir`` (highest ``version_N`` that has one),
    else the newest ``last*.ckpt`` of the old layout ``run_dir/checkpoints/``; None when there is none."""
    for folder in last_checkpoint_candidates(run_dir):
        found = _newest_last(folder)
        if found is not None:
            return found
    return None


def checkpoint_run_version(path: str | Path) -> tuple[Path, str, int] | None:
    """``(runs_dir, run_name, N)`` of a checkpoint at ``<runs_dir>/<run_name>/version_N/checkpoints/<file>``,
    or None for a checkpoint elsewhere (old layout, a copied file)."""
    path = Path(path).absolute()
    version_dir = path.parent.parent
    match = _VERSION.fullmatch(version_dir.name)
    if path.parent.name != "checkpoints" or match is None:
        return None
    return version_dir.parent.parent, version_dir.parent.name, int(match.group(1))


class RunLogger(TensorBoardLogger):
    """``TensorBoardLogger`` whose new version folder is claimed atomically (``claim_version``).

    Lightning's logger lists the folders and takes the next number, so two runs starting together get
    the same one. Only rank 0 claims; other ranks compute a provisional number until ``adopt_version``
    gives them rank 0's (``RunCheckpoint.setup`` broadcasts it). Pass ``version`` to write into an
    existing version (a resume).

    Example:
        >>> logger = RunLogger("runs", name="tiny-bhyt")  # doctest: +SKIP
        >>> logger.log_dir  # doctest: +SKIP
        'runs/tiny-bhyt/version_0'
    """

    def __init__(self, *args: Any, default_hp_metric: bool = False, **kwargs: Any) -> None:
        # no ``hp_metric = -1`` placeholder in TensorBoard's HPARAMS tab: a run's metrics are its scalars
        super().__init__(*args, default_hp_metric=default_hp_metric, **kwargs)

    claimed: bool = False
    """True once this logger created its version folder (a new run, not a resume into an existing version)."""

    @override
    def _get_next_version(self) -> int:
        if rank_zero_only.rank != 0:
            return super()._get_next_version()
        version = claim_version(self.root_dir)
        self.claimed = True
        return version

    def discard(self) -> bool:
        """Close the log and remove the version folder this logger claimed, if it holds no checkpoint
        (``discard_version``); for a run that failed before its first step. True if removed."""
        if not self.claimed or rank_zero_only.rank != 0:
            return False
        if self._experiment is not None:
            self._experiment.close()
            self._experiment = None
        removed = discard_version(self.root_dir, int(self.version))
        self.claimed = False
        return removed

    def adopt_version(self, version: int | str) -> None:
        """Use rank 0's version on this rank (a version number or folder name)."""
        self._version = version


def run_loggers(configured: Any, run_logger: dict[str, Any], runs_dir: str, run_name: str) -> list[Any]:
    """The loggers of a run whose recipe sets ``trainer.logger`` (one logger or a list, as parsed by LightningCLI).

    The run folder's ``RunLogger`` (TensorBoard, ``config.yaml``, checkpoints, ``--ckpt_path last``) comes
    first unless the recipe has a TensorBoard logger of its own. W&B, MLflow and CSV loggers whose folder and
    run name are left at their defaults write under ``runs_dir`` and carry the run's name: W&B in
    ``<runs_dir>/<run_name>/wandb/``, MLflow in the local store ``<runs_dir>/mlflow.db`` with artifacts in
    ``<runs_dir>/mlartifacts/`` (unless it has a ``tracking_uri``), CSV (``name`` left at ``lightning_logs``)
    in ``<runs_dir>/<run_name>/csv/version_N/``."""
    loggers = list(configured) if isinstance(configured, (list, tuple)) else [configured]
    for logger in loggers:
        init_args = _get(logger, "init_args")
        if init_args is not None:
            _complete_logger(str(_get(logger, "class_path") or "").rsplit(".", 1)[-1], init_args, runs_dir, run_name)
    if not any(_is_tensorboard(_get(logger, "class_path")) for logger in loggers):
        loggers.insert(0, run_logger)
    return loggers


def _complete_logger(cls: str, args: Any, runs_dir: str, run_name: str) -> None:
    """Fill the settings a logger left at its defaults with the run's folder and name."""
    run_dir = str(Path(runs_dir) / run_name)
    if cls == "WandbLogger":
        if _get(args, "save_dir") == ".":
            _set(args, "save_dir", run_dir)  # <runs_dir>/<run_name>/wandb/
        if _get(args, "name") is None:
            _set(args, "name", run_name)
    elif cls == "MLFlowLogger":
        if _get(args, "save_dir") == "./mlruns" and not _get(args, "tracking_uri"):
            # one local store for all runs; MLflow 3 refuses its file store without MLFLOW_ALLOW_FILE_STORE=true
            root = Path(runs_dir).absolute()
            root.mkdir(parents=True, exist_ok=True)
            _set(args, "tracking_uri", f"sqlite:///{root / 'mlflow.db'}")
            if _get(args, "artifact_location") is None:
                _set(args, "artifact_location", str(root / "mlartifacts"))
        if _get(args, "run_name") is None:
            _set(args, "run_name", run_name)
    elif cls == "CSVLogger" and _get(args, "name") == "lightning_logs":
        # save_dir is required by CSVLogger, so a preset gives one; the default name marks it as a placeholder
        _set(args, "save_dir", run_dir)
        _set(args, "name", "csv")  # <runs_dir>/<run_name>/csv/version_N/metrics.csv


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _set(obj: Any, key: str, value: Any) -> None:
    if isinstance(obj, dict):
        obj[key] = value
    else:
        setattr(obj, key, value)


def _is_tensorboard(class_path: Any) -> bool:
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    import importlib

    module, name = class_path.rsplit(".", 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False  # LightningCLI reports the bad class path itself
    return isinstance(cls, type) and issubclass(cls, TensorBoardLogger)

"""``RunLogFile``: a training run's log file, ``<version dir>/train.log``.

What a run prints through Python's ``logging``, its warnings and the traceback of the exception that stops
it are also written to ``train.log`` in the run's version folder (rank N > 0 writes ``train.rank<N>.log``),
so that a failure the console shows as one line, or one that scrolled away, can be read afterwards. A resumed
run appends to the file of the version it continues. The console output is unchanged.

Lines that C++ libraries (gloo, NCCL, c10d) write straight to the process's stderr never pass through
Python, so they stay on the console and are not in the file.
"""

from __future__ import annotations

import logging
import traceback
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from bhyt_pl.callbacks.checkpointing import Requeued, StoppedByCtrlC

__all__ = ["RunLogFile"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _CopyFileHandler(logging.FileHandler):
    """The file half of ``_FileCopy``. A record it cannot write (a full disk) is dropped silently: the console has
    it, and logging's default would print a ``--- Logging error ---`` traceback there for every record."""

    @override
    def handleError(self, record: logging.LogRecord) -> None:
        pass


class _FileCopy(logging.Handler):
    """Writes every record it sees once to the run's file, holding them until the file is known."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(_FORMAT))
        self._held: list[logging.LogRecord] = []
        self._file: logging.FileHandler | None = None

    def open(self, path: Path) -> None:
        self._file = _CopyFileHandler(path, mode="a", encoding="utf-8")
        self._file.setFormatter(self.formatter)
        for record in self._held:
            self._file.emit(record)
        self._held = []

    def write_text(self, text: str) -> None:
        if self._file is not None:
            try:
                self._file.stream.write(text if text.endswith("\n") else text + "\n")
                self._file.flush()
            except OSError:  # a full disk: the console still shows it, and the exception being reported goes on
                pass

    @override
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_bhyt_run_log", False):
            return  # one record can reach several of the loggers this handler is attached to
        record._bhyt_run_log = True
        if self._file is None:
            self._held.append(record)
        else:
            self._file.emit(record)

    @override
    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # what it held could not be written (a full disk)
                pass
            self._file = None
        super().close()


class RunLogFile(L.Callback):
    """Copies a fit's logging, warnings and stopping traceback to ``<log_dir>/train.log`` (module docstring).

    Messages from the start of ``fit`` are held until the version folder is known (``on_fit_start``: every rank
    has its version by then) and written first. The command line adds it to every run.

    Args:
        filename: Name of the file in the logger's ``log_dir``; rank N > 0 inserts ``.rank<N>`` before its suffix.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[RunLogFile()], max_steps=10)
    """

    def __init__(self, filename: str = "train.log") -> None:
        self.filename = filename
        self.path: Path | None = None
        """This rank's log file once it is open (None before ``on_fit_start``, or without a logger)."""
        self._handler: _FileCopy | None = None
        self._loggers: list[logging.Logger] = []
        self._root_console: logging.Handler | None = None
        self._show_warning: Any = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == TrainerFn.FITTING and self._handler is None:
            self._attach()

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.logger.log_dir if trainer.logger is not None else None
        if self._handler is None or log_dir is None:
            self._detach()
            return
        name = Path(self.filename)
        if trainer.global_rank > 0:
            name = name.with_name(f"{name.stem}.rank{trainer.global_rank}{name.suffix}")
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(log_dir) / name
        self._handler.open(self.path)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._handler is not None:
            if isinstance(exception, (StoppedByCtrlC, Requeued, SIGTERMException)):
                self._handler.write_text(f"stopped: {type(exception).__name__}: {exception}")
            else:
                self._handler.write_text("".join(traceback.format_exception(exception)))
        self._detach()  # Lightning calls no teardown hook after an exception

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._detach()

    def _attach(self) -> None:
        """Copy records of the root logger and of every logger that prints without passing them on to it
        (Lightning's and torch's keep their own console handlers), and every warning shown."""
        self._handler = _FileCopy()
        root = logging.getLogger()
        if not root.handlers and logging.lastResort is not None:
            # with no handler anywhere Python prints warnings through ``logging.lastResort``; a handler on the
            # root would silence that, so the console keeps it explicitly while the file is attached
            self._root_console = logging.lastResort
            root.addHandler(self._root_console)
        self._loggers = [root]
        for logger in list(logging.root.manager.loggerDict.values()):
            if isinstance(logger, logging.Logger) and not logger.propagate and _prints(logger):
                self._loggers.append(logger)
        for logger in self._loggers:
            logger.addHandler(self._handler)
        self._show_warning = warnings.showwarning
        warnings.showwarning = self._copy_warning

    def _copy_warning(self, message: Any, category: Any, filename: str, lineno: int, *args: Any, **kwargs: Any) -> None:
        self._show_warning(message, category, filename, lineno, *args, **kwargs)
        if self._handler is not None:
            text = warnings.formatwarning(message, category, filename, lineno).rstrip()
            self._handler.handle(logging.LogRecord("py.warnings", logging.WARNING, filename, lineno, text, None, None))

    def _detach(self) -> None:
        if self._handler is None:
            return
        for logger in self._loggers:
            logger.removeHandler(self._handler)
        if self._root_console is not None:
            logging.getLogger().removeHandler(self._root_console)
            self._root_console = None
        if warnings.showwarning == self._copy_warning:
            warnings.showwarning = self._show_warning
        self._handler.close()
        self._handler, self._loggers = None, []


def _prints(logger: logging.Logger) -> bool:
    return any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in logger.handlers)

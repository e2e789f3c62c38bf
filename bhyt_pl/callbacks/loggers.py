"""Figures to every Lightning logger, each through its own API.

Scalars need nothing special: ``Logger.log_metrics`` is common to all loggers. Figures are not part of
Lightning's ``Logger`` interface, so the callbacks (``DepthStatsMonitor``, ``StabilityMonitor``) hand
their matplotlib figures to :func:`log_figures`, which writes them where each logger keeps images:

| logger | how | where |
|---|---|---|
| ``TensorBoardLogger`` (and bhyt_pl's ``RunLogger``) | ``experiment.add_figure`` | Images tab |
| ``WandbLogger`` | ``log_image`` | the run's media (``media/images/``), one history entry per key and step |
| ``MLFlowLogger`` | ``experiment.log_figure`` (``MlflowClient``) | run artifacts ``figures/<tag>/step_<NNNNNN>.png`` |
| ``CSVLogger`` | a PNG file | ``<log_dir>/figures/<tag>/step_<NNNNNN>.png``, beside ``metrics.csv`` |

Any other logger gets the scalars only (one info line says so). Call from global rank 0, as the
callbacks do after their cross-rank reduction.

Example:
    >>> from matplotlib.figure import Figure
    >>> from lightning.pytorch.loggers import CSVLogger
    >>> logger = CSVLogger("logs")  # doctest: +SKIP
    >>> log_figures([logger], lambda: {"depth/magnitude": Figure()}, step=20)  # doctest: +SKIP
    >>> # logs/lightning_logs/version_0/figures/depth/magnitude/step_000020.png
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

__all__ = ["figure_path", "log_figures", "takes_figures"]

log = logging.getLogger(__name__)
_FIGURE_LOGGERS = (TensorBoardLogger, WandbLogger, MLFlowLogger, CSVLogger)
_warned: set[type] = set()


def takes_figures(logger: Logger) -> bool:
    """Whether :func:`log_figures` can write images to this logger."""
    return isinstance(logger, _FIGURE_LOGGERS)


def figure_path(tag: str, step: int) -> str:
    """Relative path of one figure for file-based loggers: ``figures/<tag>/step_<NNNNNN>.png``."""
    return f"figures/{tag}/step_{step:06d}.png"


def log_figures(loggers: Iterable[Logger], figures: Callable[[], Mapping[str, Any]], step: int) -> None:
    """Write matplotlib figures, keyed by tag (``depth/magnitude``), to every logger that takes images.

    Args:
        loggers: the trainer's loggers (``trainer.loggers``).
        figures: builds ``{tag: Figure}``; called at most once, and only when some logger takes figures,
            so runs without one pay nothing for drawing.
        step: the global step the figures belong to.
    """
    loggers = list(loggers)
    for logger in loggers:
        if not takes_figures(logger) and type(logger) not in _warned:
            _warned.add(type(logger))
            log.info("%s has no figure support in bhyt_pl: it gets the scalars only", type(logger).__name__)
    targets = [logger for logger in loggers if takes_figures(logger)]
    if not targets:
        return
    drawn = figures()
    for logger in targets:
        for tag, figure in drawn.items():
            _log_figure(logger, tag, figure, step)


def _log_figure(logger: Logger, tag: str, figure: Any, step: int) -> None:
    if isinstance(logger, TensorBoardLogger):
        # close=False: the same figure goes on to the next logger
        logger.experiment.add_figure(tag, figure, global_step=step, close=False)
    elif isinstance(logger, WandbLogger):
        logger.log_image(key=tag, images=[figure], step=step)
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_figure(logger.run_id, figure, figure_path(tag, step))
    elif isinstance(logger, CSVLogger):
        path = Path(logger.log_dir) / figure_path(tag, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")

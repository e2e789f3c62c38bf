"""``python -m bhyt_pl``: LightningCLI for fit/validate/test/predict, plus the package's own tools.

The LightningCLI subclass only adds defaults and argument links (style practice 16):
- ``model.seq_len`` and ``model.tokenizer`` come from the instantiated data module;
- runs log to TensorBoard under ``<runs_dir>/<run_name>/version_N`` (``run_name`` defaults to
  ``<preset>-<norm>``) and checkpoint to ``<runs_dir>/<run_name>/checkpoints`` (``last.ckpt``
  is kept), so ``--ckpt_path last`` finds the previous run's last checkpoint;
- ``ModelCheckpoint`` (``--checkpoint.*``) and ``LearningRateMonitor`` (``--lr_monitor.*``) are always on,
  and ``TokenThroughputMonitor`` (tokens/s in the progress bar) unless the config already has one;
- single-file checkpoints are written atomically (``AtomicCheckpointIO``) unless ``trainer.plugins`` is set.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from bhyt_pl.module import LlamaLM

__all__ = ["BHyTCLI", "main"]

TOOLS = {
    "eval": "bhyt_pl.eval",
    "bench": "bhyt_pl.bench",
    "study": "bhyt_pl.study",
    "consolidate": "bhyt_pl.distributed",
    "export": "bhyt_pl.convert",
}
"""Subcommands that are not Lightning's: each module exposes ``main(argv) -> int``."""


def _data_seq_len(data: Any) -> int | None:
    """Training sequence length of any data module (``seq_len`` for C4, ``max_seq_len`` for LIMA)."""
    for name in ("seq_len", "max_seq_len"):
        value = getattr(data, name, None)
        if isinstance(value, int):
            return value
    return None


def _data_tokenizer(data: Any) -> str | None:
    value = getattr(data, "tokenizer", None)
    return value if isinstance(value, str) else None


def _norm_label(norm: Any) -> str:
    if isinstance(norm, str):
        return norm
    class_path = getattr(norm, "class_path", None) or (norm.get("class_path") if isinstance(norm, dict) else None)
    return str(class_path).rsplit(".", 1)[-1].lower() if class_path else "custom"


class BHyTCLI(LightningCLI):
    """LightningCLI with bhyt_pl's defaults and links."""

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 - jsonargparse parser
        parser.add_argument("--runs_dir", type=str, default="runs", help="Root directory of logs and checkpoints.")
        parser.add_argument(
            "--run_name", type=str | None, default=None, help="Run directory name; default '<preset>-<norm>'."
        )
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_train_steps": 1000})
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.set_defaults({"lr_monitor.logging_interval": "step"})
        parser.link_arguments("data", "model.seq_len", compute_fn=_data_seq_len, apply_on="instantiate")
        parser.link_arguments("data", "model.tokenizer", compute_fn=_data_tokenizer, apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        run_name = cfg.run_name or f"{cfg.model.preset}-{_norm_label(cfg.model.norm)}"
        if cfg.trainer.logger is None or cfg.trainer.logger is True:
            cfg.trainer.logger = {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": cfg.runs_dir, "name": run_name},
            }
        if cfg.checkpoint.dirpath is None:
            cfg.checkpoint.dirpath = f"{cfg.runs_dir}/{run_name}/checkpoints"
        callbacks = list(cfg.trainer.callbacks or [])
        if not any(str(getattr(cb, "class_path", "")).endswith("TokenThroughputMonitor") for cb in callbacks):
            # tokens/s in the progress bar by default; a preset (callbacks/throughput.yaml) configures it
            callbacks.append(Namespace(class_path="bhyt_pl.callbacks.TokenThroughputMonitor", init_args=Namespace()))
            cfg.trainer.callbacks = callbacks
        if not cfg.trainer.plugins:  # a kill during a save never leaves a truncated last.ckpt
            cfg.trainer.plugins = [{"class_path": "bhyt_pl.distributed.AtomicCheckpointIO"}]


def main(args: list[str] | None = None, run: bool = True, **kwargs: Any) -> BHyTCLI | int | None:
    """Entry point. ``args`` defaults to ``sys.argv[1:]``; tools (``eval``, ``bench``, ...) return an exit code."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in TOOLS:
        import importlib

        tool: Callable[[list[str]], int] = importlib.import_module(TOOLS[argv[0]]).main
        return tool(argv[1:])
    return BHyTCLI(
        LlamaLM,
        LightningDataModule,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=argv if (args is not None or not run) else None,
        run=run,
        **kwargs,
    )

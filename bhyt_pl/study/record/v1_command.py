"""The study's command line as schema-1 records wrote it, pinned: how a converter rebuilds such a record's setup.

A record of schema 1 holds its command (``meta["command"]``) but not the data, validation batches and trainer
settings that command resolved to. This parser reads exactly the options that shaped them, with the defaults they
had then, and is never changed with the live command line: a default changed since, or an option renamed, does
not change how an old record reads. Every other option of that command line (schemes, rates, budget, launcher)
shaped the runs, which the record holds whole, and is skipped.
"""

from __future__ import annotations

import argparse
import shlex

from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.run.data import StudyData

__all__ = ["COMMAND_PREFIX", "parse_v1_command"]

COMMAND_PREFIX = "python -m bhyt_pl study "

# the schema-1 budgets' (seq_len, batch_size, val_batches) by (sweep, quick)
_SHAPES = {
    (False, False): (64, 8, 4),
    (False, True): (64, 8, 4),
    (True, False): (64, 8, 2),
    (True, True): (64, 4, 1),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bhyt_pl study (schema 1)", add_help=False, allow_abbrev=False)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--data-files", default="embedded")
    p.add_argument("--data-path", default="allenai/c4")
    p.add_argument("--tokenizer", default="embedded")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--val-batches", type=int, default=None)
    p.add_argument("--shuffle-buffer", type=int, default=1000)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", default="1")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--progress-bar", action="store_true")
    p.add_argument("--config", default=None)
    return p


def parse_v1_command(command: str) -> tuple[StudyData, int, TrainerSettings]:
    """The data, the number of validation batches and the trainer settings ``command`` (a schema-1 record's
    ``meta["command"]``) resolved to; a ``ValueError`` naming the problem when it cannot say."""
    if not command.startswith(COMMAND_PREFIX):
        raise ValueError(f"its command {command!r} is not a study command ({COMMAND_PREFIX.strip()} ...)")
    argv = shlex.split(command)[len(shlex.split(COMMAND_PREFIX)) :]
    args, _ = _parser().parse_known_args(argv)  # the options that shaped the runs, not their setup: skipped
    if args.config is not None:
        raise ValueError(
            f"its command reads --config {args.config}, whose content a schema-1 record does not hold: "
            "its setup cannot be rebuilt"
        )
    seq_len, batch_size, val_batches = _SHAPES[(args.sweep, args.quick)]
    data = StudyData(
        None if str(args.data_files).lower() == "none" else args.data_files,
        args.data_path,
        args.tokenizer,
        args.seq_len if args.seq_len is not None else seq_len,
        args.batch_size if args.batch_size is not None else batch_size,
        args.num_workers,
        args.shuffle_buffer,
    )
    devices: int | str = int(args.devices) if str(args.devices).isdigit() else args.devices
    settings = TrainerSettings(
        args.accelerator, devices, args.precision, progress_bar=args.progress_bar, compile=args.compile
    )
    return data, args.val_batches if args.val_batches is not None else val_batches, settings

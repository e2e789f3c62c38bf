"""The options every kind of study that trains shares: each run's schedule, its data and its hardware, and the plain
data they resolve into (``study_data``, ``trainer_settings``). One definition, so a flag means the same in the
exploration and the token-budget map."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Sequence

from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.run.data import StudyData

__all__ = [
    "COMPILE_DEFAULT",
    "add_data_arguments",
    "add_hardware_arguments",
    "add_schedule_arguments",
    "parse_overrides",
    "study_data",
    "trainer_settings",
]


COMPILE_DEFAULT = True
"""Study runs compile each block unless ``--no-compile``: a default run (180 steps) took 0.74x the eager run's
wall time on 2 CPU cores, the first compile included (docs/performance.md, "Study run")."""


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_overrides(items: Sequence[str]) -> dict[str, object]:
    """``--override FIELD=VALUE ...`` as ``LlamaConfig`` fields (a value is a Python literal when it reads as one:
    ``dim=256`` is an int, ``norm_eps=1e-6`` a float, ``tie_embeddings=False`` a bool)."""
    overrides = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--override {item!r} must be FIELD=VALUE, e.g. --override dim=256")
        overrides[key] = _literal(value)
    return overrides


def add_schedule_arguments(group: argparse._ArgumentGroup) -> None:
    """Warmup, weight decay, gradient clip and the divergence bound, into ``group`` (a kind's model group)."""
    group.add_argument(
        "--warmup-ratio",
        type=float,
        default=None,
        help="linear warmup fraction of the steps; default the scheme's recipe (nGPT: none), else 0.05",
    )
    group.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="AdamW weight decay (matrices only); default the scheme's recipe (nGPT: 0), else 0.1",
    )
    group.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip")
    group.add_argument(
        "--max-loss",
        type=float,
        default=None,
        help="divergence bound on the training loss (NaN/inf always diverges); default 1.5 * ln(vocab_size)",
    )


def add_data_arguments(p: argparse.ArgumentParser, seq_len: int, batch_size: int, val_batches: int) -> None:
    """The data group; ``seq_len``, ``batch_size`` and ``val_batches`` are the kind's defaults, as its help says
    (the options themselves default to None: the kind's mode decides)."""
    data = p.add_argument_group("data (C4DataModule)")
    data.add_argument(
        "--data-files",
        default="embedded",
        help="C4-format shards: 'embedded' (bundled corpus), a directory or glob; 'none' streams --data-path",
    )
    data.add_argument("--data-path", default="allenai/c4", help="Hub dataset when --data-files none")
    data.add_argument("--tokenizer", default="embedded", help="'embedded', a tokenizer.json path or a Hub name")
    data.add_argument("--seq-len", type=int, default=None, help=f"training sequence length; default {seq_len}")
    data.add_argument("--batch-size", type=int, default=None, help=f"sequences per step; default {batch_size}")
    data.add_argument(
        "--val-batches",
        type=int,
        default=None,
        help=f"fixed validation batches: validation loss and depth statistics (at least 4); default {val_batches}",
    )
    data.add_argument("--shuffle-buffer", type=int, default=1000, help="documents in the streaming shuffle buffer")
    data.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")


def add_hardware_arguments(p: argparse.ArgumentParser, compile_default: bool = COMPILE_DEFAULT) -> None:
    """The hardware group (``L.Trainer``'s accelerator, devices and precision; workers; compile)."""
    hw = p.add_argument_group("hardware (L.Trainer)")
    hw.add_argument("--accelerator", default="cpu", help="cpu, gpu, auto, ...")
    hw.add_argument("--devices", default="1", help="devices per run; more than 1: launch with torchrun")
    hw.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, ...")
    hw.add_argument(
        "--workers",
        type=int,
        default=None,
        help="runs in parallel on this machine (--launcher pool), one process each: on CPU one torch thread each, "
        "default the CPUs this process may use; with a GPU accelerator one GPU each, default the visible GPUs; "
        "1: runs one after another in this process",
    )
    hw.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=compile_default,
        help="torch.compile each block of every run; --no-compile: eager (docs/performance.md, "
        "'Study run': speed-up and how far the losses may differ)",
    )
    hw.add_argument("--progress-bar", action="store_true", help="show Lightning's progress bar")


def study_data(args: argparse.Namespace, seq_len: int, batch_size: int) -> StudyData:
    """Every run's data module from the data options (``--data-files none``: stream ``--data-path``)."""
    data_files = None if str(args.data_files).lower() == "none" else args.data_files
    return StudyData(
        data_files, args.data_path, args.tokenizer, seq_len, batch_size, args.num_workers, args.shuffle_buffer
    )


def trainer_settings(args: argparse.Namespace) -> TrainerSettings:
    """How every run executes, from the hardware options."""
    devices: int | str = int(args.devices) if str(args.devices).isdigit() else args.devices
    return TrainerSettings(
        args.accelerator, devices, args.precision, progress_bar=args.progress_bar, compile=args.compile
    )

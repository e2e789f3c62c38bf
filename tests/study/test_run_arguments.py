"""The options every kind of study that trains shares (``bhyt_pl.study.cli.run_arguments``): the overrides' values
read as Python literals, the data and hardware options resolved into plain data, and one definition of each flag
in the exploration's and the token-budget map's parsers."""

from __future__ import annotations

import argparse

import pytest

from bhyt_pl.study.cli.exploration import EXPLORATION
from bhyt_pl.study.cli.kinds import study_parser
from bhyt_pl.study.cli.run_arguments import (
    add_data_arguments,
    add_hardware_arguments,
    parse_overrides,
    study_data,
    trainer_settings,
)
from bhyt_pl.study.cli.token_budget import TOKEN_BUDGET


def test_override_values_are_literals_where_they_read_as_one() -> None:
    parsed = parse_overrides(["dim=256", "norm_eps=1e-6", "tie_embeddings=False", "norm=bhyt"])
    assert parsed == {"dim": 256, "norm_eps": 1e-6, "tie_embeddings": False, "norm": "bhyt"}
    assert type(parsed["dim"]) is int and type(parsed["norm_eps"]) is float
    with pytest.raises(ValueError, match="--override 'dim' must be FIELD=VALUE"):
        parse_overrides(["dim"])


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_data_arguments(p, 64, 8, 4)
    add_hardware_arguments(p, compile_default=True)
    return p.parse_args(list(argv))


def test_the_data_and_hardware_options_resolve_to_plain_data() -> None:
    data = study_data(_args("--data-files", "none", "--data-path", "my/c4", "--shuffle-buffer", "7"), 32, 2)
    assert (data.data_files, data.path, data.seq_len, data.batch_size, data.shuffle_buffer) == (None, "my/c4", 32, 2,
                                                                                               7)  # fmt: skip
    assert study_data(_args(), 64, 8).data_files == "embedded"
    settings = trainer_settings(_args("--devices", "2", "--no-compile", "--precision", "bf16-mixed"))
    assert (settings.devices, settings.compile, settings.precision) == (2, False, "bf16-mixed")
    assert trainer_settings(_args("--devices", "auto")).devices == "auto" and trainer_settings(_args()).compile


def test_both_kinds_that_train_take_the_same_flags_the_same_way() -> None:
    given = ["--data-files", "shards/", "--tokenizer", "tok.json", "--val-batches", "5", "--accelerator", "gpu",
             "--workers", "2", "--no-compile", "--warmup-ratio", "0.1", "--weight-decay", "0.0", "--grad-clip",
             "0.5", "--max-loss", "9", "--override", "dim=96"]  # fmt: skip
    names = ["data_files", "tokenizer", "val_batches", "accelerator", "workers", "compile", "warmup_ratio",
             "weight_decay", "grad_clip", "max_loss", "override", "num_workers", "shuffle_buffer"]  # fmt: skip
    for argv in ([], given):
        values = [vars(study_parser(kind).parse_args(argv)) for kind in (EXPLORATION, TOKEN_BUDGET)]
        assert [{n: v[n] for n in names} for v in values] == [{n: values[0][n] for n in names}] * 2
    assert values[0]["override"] == ["dim=96"] and values[0]["compile"] is False

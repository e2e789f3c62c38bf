"""The pinned schema-1 command line (``bhyt_pl.study.record.v1_command``): the data, validation batches and trainer
settings a schema-1 record's command resolved to, with that version's defaults written out here by hand; the options
that shaped only the runs are skipped, and a command it cannot read is named."""

from __future__ import annotations

import pytest

from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.record.v1_command import parse_v1_command
from bhyt_pl.study.run.data import StudyData

PREFIX = "python -m bhyt_pl study "


@pytest.mark.parametrize(
    "mode, shapes",
    [
        ("", (64, 8, 4)),  # schema 1's full study: 8 sequences of 64 tokens a step, 4 validation batches
        ("--quick", (64, 8, 4)),
        ("--sweep", (64, 8, 2)),
        ("--sweep --quick", (64, 4, 1)),
    ],
)
def test_each_mode_has_the_shapes_schema_1_gave_it(mode: str, shapes: tuple[int, int, int]) -> None:
    data, val_batches, settings = parse_v1_command(PREFIX + mode + " --workers 2 --schemes rmsnorm bhyt")
    seq_len, batch_size, batches = shapes
    assert data == StudyData("embedded", "allenai/c4", "embedded", seq_len, batch_size, 0, 1000)
    assert val_batches == batches
    assert settings == TrainerSettings("cpu", 1, "32-true", compile=True)  # schema 1 compiled by default


def test_explicit_options_win_and_the_rest_of_the_command_is_skipped() -> None:
    command = (
        PREFIX + "--quick --seq-len 32 --batch-size 2 --val-batches 6 --shuffle-buffer 4 --num-workers 1 --no-compile "
        "--accelerator gpu --devices 2 --precision bf16-mixed --data-files none --data-path my/c4 --tokenizer t.json "
        "--lrs 1e-3 3e-3 --matched-lrs 3e-3 --out somewhere --launcher slurm --partition gpu"
    )
    data, val_batches, settings = parse_v1_command(command)
    assert data == StudyData(None, "my/c4", "t.json", 32, 2, 1, 4)
    assert val_batches == 6
    assert settings == TrainerSettings("gpu", 2, "bf16-mixed", compile=False)


def test_a_command_it_cannot_read_is_named() -> None:
    with pytest.raises(ValueError, match="is not a study command"):
        parse_v1_command("python -m bhyt_pl fit --config recipes/tiny.yaml")
    with pytest.raises(ValueError, match="reads --config c.yaml, whose content a schema-1 record does not hold"):
        parse_v1_command(PREFIX + "--config c.yaml")

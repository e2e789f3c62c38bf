"""Checkpoint reading and the resume configuration check, against hand-written expectations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bhyt_pl.checkpoint import RESUME_MUST_MATCH, read_checkpoint, read_checkpoint_metadata, resume_mismatches
from bhyt_pl.errors import UsageError
from bhyt_pl.module import LlamaLM


def _checkpoint_of(lm: LlamaLM) -> dict:
    checkpoint = {"hyper_parameters": dict(lm.hparams), "state_dict": {}}
    lm.on_save_checkpoint(checkpoint)
    return checkpoint


def test_bhyt_T_and_every_model_field_is_compared() -> None:
    saved = _checkpoint_of(LlamaLM(norm="bhyt", seq_len=256, lr=3e-3))
    same = LlamaLM(norm="bhyt", seq_len=256, lr=3e-3)
    assert resume_mismatches(same.config, same.hparams, saved) == []
    other = LlamaLM(norm="bhyt", norm_args={"lambda_attn": 1.0}, seq_len=128, overrides={"n_layers": 2}, lr=1e-3)
    assert resume_mismatches(other.config, other.hparams, saved) == [
        "model.overrides.n_layers: checkpoint 4, this run 2",
        "model.norm_args.lambda_attn: checkpoint '<unset>', this run 1.0",
        "model.norm_args.seq_len: checkpoint 256, this run 128",  # BHyT's T
        "model.seq_len: checkpoint 256, this run 128",
        "model.lr: checkpoint 0.003, this run 0.001",
    ]


def test_execution_settings_may_change_on_resume() -> None:
    saved = _checkpoint_of(LlamaLM(seq_len=64))
    resumed = LlamaLM(seq_len=64, compile=True, activation_checkpointing=True)
    assert resume_mismatches(resumed.config, resumed.hparams, saved) == []
    assert "compile" not in RESUME_MUST_MATCH and "lr" in RESUME_MUST_MATCH


def test_hparams_carry_the_norm_for_hparams_yaml_and_tensorboard() -> None:
    """``hparams_initial`` (what loggers write) lacked ``norm`` and ``norm_args``."""
    lm = LlamaLM(norm="bhyt", norm_args={"lambda_attn": 1.0}, seq_len=64)
    assert lm.hparams_initial["norm"] == "bhyt"
    assert lm.hparams_initial["norm_args"] == {"lambda_attn": 1.0, "seq_len": 64}


@pytest.mark.parametrize("content", [b"notes\n", b"PK\x03\x04broken zip", b""])
def test_a_file_that_is_not_a_checkpoint_is_a_usage_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.ckpt"
    path.write_bytes(content)
    for read in (read_checkpoint, read_checkpoint_metadata):
        with pytest.raises(UsageError, match=r"'.*x\.ckpt' is not a checkpoint torch can read"):
            read(path)


def test_a_foreign_checkpoint_is_named(tmp_path: Path) -> None:
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(UsageError, match=r"'.*other\.ckpt' is not a bhyt_pl LlamaLM checkpoint"):
        read_checkpoint_metadata(path)

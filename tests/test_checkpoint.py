"""Checkpoint reading and the resume configuration check, against hand-written expectations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lm_fixtures import bhyt_trained_between_refreshes

from bhyt_pl.checkpoint import (
    NORM_CONSTANTS,
    RESUME_MUST_MATCH,
    load_model,
    read_checkpoint,
    read_checkpoint_metadata,
    resume_mismatches,
)
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
        "model.norm_args.lambda_attn: checkpoint 2.0, this run 1.0",
        "model.norm_args.seq_len: checkpoint 256, this run 128",  # BHyT's T
        "model.seq_len: checkpoint 256, this run 128",
        "model.lr: checkpoint 0.003, this run 0.001",
    ]


def test_the_resume_check_compares_resolved_values() -> None:
    """Trained with ``--model.norm bhyt`` and resumed with ``--config recipes/norms/bhyt.yaml`` (which spells
    out the defaults), six fields were reported as ``'<unset>' vs 2.0`` and the valid resume was refused."""
    import yaml

    overlay = yaml.safe_load((Path(__file__).parents[1] / "recipes" / "norms" / "bhyt.yaml").read_text())["model"]
    saved = _checkpoint_of(LlamaLM(norm="bhyt", seq_len=256))
    assert saved["bhyt_pl"]["model_config"]["norm_args"] == {"seq_len": 256}  # the defaults are not spelled out
    spelled = LlamaLM(norm=overlay["norm"], norm_args=overlay["norm_args"], seq_len=256)
    assert len(overlay["norm_args"]) == 6 and resume_mismatches(spelled.config, spelled.hparams, saved) == []
    changed = LlamaLM(norm="bhyt", norm_args={**overlay["norm_args"], "p": 0.9}, seq_len=256)
    assert resume_mismatches(changed.config, changed.hparams, saved) == [
        "model.norm_args.p: checkpoint 0.99, this run 0.9"
    ]
    other_norm = LlamaLM(norm="layernorm", seq_len=256)  # the norm's own arguments are not listed on top
    assert resume_mismatches(other_norm.config, other_norm.hparams, saved) == [
        "model.norm: checkpoint 'bhyt', this run 'layernorm'"
    ]
    rms = _checkpoint_of(LlamaLM(seq_len=64))
    explicit_default = LlamaLM(norm_args={"eps": 1e-5}, seq_len=64)
    assert resume_mismatches(explicit_default.config, explicit_default.hparams, rms) == []


def test_the_resume_check_treats_an_alias_as_the_value_it_names() -> None:
    """``qk_norm: true`` is an alias of ``"head"``: the check compares what the config resolves to."""
    saved = _checkpoint_of(LlamaLM(overrides={"qk_norm": "head"}, seq_len=64))
    saved["bhyt_pl"]["model_config"]["qk_norm"] = True  # as a checkpoint written before the modes has it
    resumed = LlamaLM(overrides={"qk_norm": "head"}, seq_len=64)
    assert resume_mismatches(resumed.config, resumed.hparams, saved) == []
    full = LlamaLM(overrides={"qk_norm": "full"}, seq_len=64)
    assert resume_mismatches(full.config, full.hparams, saved) == [
        "model.overrides.qk_norm: checkpoint 'head', this run 'full'"
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
        with pytest.raises(UsageError, match=r"'.*x\.ckpt' is not a checkpoint") as err:
            read(path)
        assert "mmap" not in str(err.value) and "\n" not in str(err.value)  # torch's advice is not the user's fix


def test_a_foreign_checkpoint_is_named(tmp_path: Path) -> None:
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(UsageError, match=r"'.*other\.ckpt' is not a bhyt_pl LlamaLM checkpoint"):
        read_checkpoint_metadata(path)


def test_load_model_uses_the_norm_constants_the_run_was_using(tmp_path: Path) -> None:
    """``load_model`` recomputed BHyT's c from the weights: between two refreshes that is a value the run never
    used, so an evaluation of the checkpoint did not compute what the run computed at that step."""
    lm, ckpt = bhyt_trained_between_refreshes(tmp_path)
    loaded = load_model(ckpt)
    assert [float(a.norms.c) for a in loaded.model.layers] == [float(b.norms.c) for b in lm.model.layers]
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded.model(idx), lm.model.eval()(idx))
    lm.model.refresh_norm_constants()  # what a checkpoint without them gets: c from its weights
    checkpoint = torch.load(ckpt, weights_only=False)
    del checkpoint[NORM_CONSTANTS]
    torch.save(checkpoint, tmp_path / "older.ckpt")
    older = load_model(tmp_path / "older.ckpt")
    assert [float(a.norms.c) for a in older.model.layers] == [float(b.norms.c) for b in lm.model.layers]
    assert [float(a.norms.c) for a in older.model.layers] != [float(a.norms.c) for a in loaded.model.layers]

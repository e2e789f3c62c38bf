"""The CLI: every recipe parses, bad recipes fail before work, the embedded default trains and checkpoints."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from bhyt_pl.cli import main, user_error_message
from bhyt_pl.failures import python_command

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
OVERLAY_DIRS = ("norms", "distributed", "loggers", "tiny")
STUDY_RECIPES = "study"  # `python -m bhyt_pl study --config`: tests/study/test_config_file.py parses them
BASES = sorted(p for p in RECIPES.rglob("*.yaml") if p.parent.name not in (*OVERLAY_DIRS, STUDY_RECIPES))
OVERLAYS = sorted((RECIPES / "norms").glob("*.yaml"))
STRATEGIES = sorted((RECIPES / "distributed").glob("*.yaml"))
LOGGERS = sorted((RECIPES / "loggers").glob("*.yaml"))
TINY_OVERLAYS = sorted((RECIPES / "tiny").glob("*.yaml"))


def _print_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exc:
        main(["fit", *args, "--print_config"])
    assert exc.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("recipe", BASES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_every_base_recipe_parses(recipe: Path, capsys) -> None:
    config = _print_config(capsys, "--config", str(recipe))
    assert config["model"]["preset"]
    assert config["data"]["class_path"].startswith("bhyt_pl.data.")


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.stem)
def test_every_norm_overlay_stacks_on_a_paper_recipe(overlay: Path, capsys) -> None:
    config = _print_config(capsys, "--config", str(RECIPES / "pretrain/llama-1b.yaml"), "--config", str(overlay))
    expected = yaml.safe_load(overlay.read_text())["model"]
    assert config["model"]["norm"] == expected.get("norm", "rmsnorm")  # model options (qk_norm) keep the norm
    assert config["model"]["preset"] == "llama-1b"
    for key, value in (expected.get("norm_args") or {}).items():
        assert config["model"]["norm_args"][key] == value
    for key, value in (expected.get("overrides") or {}).items():
        assert config["model"]["overrides"][key] == value


def test_qk_norm_is_one_line_on_any_scheme(capsys) -> None:
    stacked = ["--config", str(RECIPES / "norms/derf.yaml"), "--config", str(RECIPES / "norms/qk_norm.yaml")]
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), *stacked)
    assert config["model"]["norm"] == "derf" and config["model"]["overrides"] == {"qk_norm": "head"}
    line = ["--model.norm", "post_ln", "--model.overrides", "{qk_norm: true}"]  # true: the alias of head
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), *line)
    assert config["model"]["norm"] == "post_ln" and config["model"]["overrides"] == {"qk_norm": True}
    olmo2 = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--config", str(RECIPES / "norms/olmo2.yaml"))
    assert olmo2["model"]["norm"] == "reordered" and olmo2["model"]["overrides"]["qk_norm"] == "full"


@pytest.mark.parametrize("overlay", LOGGERS, ids=lambda p: p.stem)
def test_every_logger_overlay_appends_its_logger(overlay: Path, capsys) -> None:
    assert {p.stem for p in LOGGERS} == {"wandb", "mlflow", "csv"}
    (expected,) = yaml.safe_load(overlay.read_text())["trainer"]["logger+"]
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--config", str(overlay))
    assert [lg["class_path"] for lg in config["trainer"]["logger"]] == [expected["class_path"]]


@pytest.mark.parametrize("overlay", STRATEGIES, ids=lambda p: p.stem)
def test_every_strategy_overlay_stacks(overlay: Path, capsys) -> None:
    args = ["--config", str(RECIPES / "pretrain/llama-1b.yaml"), "--config", str(RECIPES / "norms/bhyt.yaml")]
    config = _print_config(capsys, *args, "--config", str(overlay))
    expected = yaml.safe_load(overlay.read_text())["trainer"]
    for key in ("strategy", "num_nodes", "devices"):
        if key in expected:
            got = config["trainer"][key]
            want = expected[key]
            assert (got == want) if isinstance(want, (str, int)) else got["class_path"] == want["class_path"]
    assert config["model"]["norm"] == "bhyt"


@pytest.mark.parametrize("overlay", TINY_OVERLAYS, ids=lambda p: p.stem)
def test_every_tiny_overlay_stacks_on_the_tiny_recipe(overlay: Path, capsys) -> None:
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--config", str(overlay))
    expected = yaml.safe_load(overlay.read_text())["model"]
    assert config["model"]["preset"] == "tiny" and config["model"]["norm"] == overlay.stem
    assert all(config["model"][key] == value for key, value in expected.items())


def test_ngpt_keeps_each_recipes_rate_and_tiny_has_its_own(capsys) -> None:
    """nGPT's best rate depends on the width: a rate tuned at tiny (d = 128) must not reach d = 2048."""
    for size, lr in (("374m", 3e-4), ("1b", 3e-4), ("3b", 3e-4)):
        base = ["--config", str(RECIPES / f"pretrain/llama-{size}.yaml")]
        config = _print_config(capsys, *base, "--config", str(RECIPES / "norms/ngpt.yaml"))
        assert (config["model"]["norm"], config["model"]["lr"]) == ("ngpt", lr)
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--config", str(RECIPES / "tiny/ngpt.yaml"))
    assert (config["model"]["norm"], config["model"]["lr"]) == ("ngpt", 3e-2)
    line = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--model.norm", "ngpt")
    assert line["model"]["lr"] == 3e-3  # the one-line switch keeps the recipe's rate; the overlay brings tiny's


def test_base_recipes_leave_weight_decay_and_warmup_to_the_scheme(capsys) -> None:
    """They set exactly LlamaLM's defaults, which the CLI cannot tell from a user's choice, so nGPT trained with
    weight decay 0.1 and 5 % warmup on ``--model.norm ngpt`` (loss 8.42 at step 30 against bhyt's 5.85)."""
    for recipe in [RECIPES / "tiny.yaml", *sorted((RECIPES / "pretrain").glob("*.yaml"))]:
        model = _print_config(capsys, "--config", str(recipe))["model"]
        assert (model["weight_decay"], model["warmup_ratio"], model["warmup_steps"]) == (None, None, None), recipe


def _settings(tmp_path: Path, *args: str) -> tuple[dict, dict]:
    cli = main(["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), *args], run=False)
    keys = ("weight_decay", "warmup_ratio", "warmup_steps")
    return {k: cli.model.hparams[k] for k in keys}, {k: cli.model.training_sources[k] for k in keys}


def test_training_settings_precedence_scheme_base_overlay_command_line(tmp_path: Path) -> None:
    """Lowest first: the scheme's declared defaults (else LlamaLM's), the base recipe, the norm overlay, the
    command line; the source of each setting is the file or the command line that set it."""
    values, sources = _settings(tmp_path, "--model.norm", "ngpt")
    assert values == {"weight_decay": 0.0, "warmup_ratio": 0.05, "warmup_steps": 0}
    assert sources == {"weight_decay": "norm ngpt", "warmup_ratio": "LlamaLM default", "warmup_steps": "norm ngpt"}
    values, sources = _settings(tmp_path)  # rmsnorm declares nothing: LlamaLM's defaults, as the recipe had them
    assert values == {"weight_decay": 0.1, "warmup_ratio": 0.05, "warmup_steps": None}
    assert set(sources.values()) == {"LlamaLM default"}
    base = tmp_path / "base.yaml"  # a base recipe of the user's that sets weight decay
    base.write_text(yaml.safe_dump({"model": {"weight_decay": 0.05}}))
    overlay = tmp_path / "overlay.yaml"  # a norm overlay that sets it again, and warmup
    overlay.write_text(yaml.safe_dump({"model": {"norm": "ngpt", "weight_decay": 0.02, "warmup_ratio": 0.1}}))
    values, sources = _settings(tmp_path, "--config", str(base), "--model.norm", "ngpt")
    assert (values["weight_decay"], sources["weight_decay"]) == (0.05, str(base))
    values, sources = _settings(tmp_path, "--config", str(base), "--config", str(overlay))
    assert values == {"weight_decay": 0.02, "warmup_ratio": 0.1, "warmup_steps": None}  # the recipe's warmup_ratio
    assert sources == {"weight_decay": str(overlay), "warmup_ratio": str(overlay), "warmup_steps": "LlamaLM default"}
    stacked = ("--config", str(base), "--config", str(overlay))
    values, sources = _settings(tmp_path, *stacked, "--model.weight_decay", "0.01")
    assert (values["weight_decay"], sources["weight_decay"]) == (0.01, "command line")
    values, sources = _settings(tmp_path, "--model.weight_decay=0.3", "--config", str(overlay))  # later wins
    assert (values["weight_decay"], sources["weight_decay"]) == (0.02, str(overlay))


def test_the_fit_logs_one_line_of_training_settings_and_their_sources(tmp_path: Path, caplog) -> None:
    args = ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--model.norm", "ngpt",
            "--model.warmup_ratio", "0.2", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
            "--data.init_args.seq_len", "16", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    with caplog.at_level("INFO"):
        main(args)
    lines = [r.getMessage() for r in caplog.records if "training settings" in r.getMessage()]
    assert lines == ["LlamaLM: training settings weight_decay=0.0 (norm ngpt), warmup_ratio=0.2 (command line), "
                     "warmup_steps=None (LlamaLM default)"]  # fmt: skip


def test_validate_on_a_runs_checkpoint_logs_into_its_version(tmp_path: Path) -> None:
    """Each call created a new version_N (a log, config.yaml, no checkpoint) beside the run it validated."""
    common = ["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--data.init_args.seq_len", "16",
              "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    main(["fit", *common, "--trainer.max_steps", "2"])
    version = tmp_path / "tiny-rmsnorm" / "version_0"
    config = (version / "config.yaml").read_text()
    events = len(list(version.glob("events.out.tfevents.*")))
    for ckpt_path in (str(version / "checkpoints" / "last.ckpt"), "last"):
        cli = main(["validate", *common, "--ckpt_path", ckpt_path])
        assert cli.trainer.logger.log_dir == str(version)
    assert sorted(p.name for p in (tmp_path / "tiny-rmsnorm").iterdir()) == ["version_0"]
    assert (version / "config.yaml").read_text() == config  # the fit's configuration stays
    assert "subcommand: validate" not in config and (version / "config_validate.yaml").is_file()
    assert len(list(version.glob("events.out.tfevents.*"))) == events + 2  # val/loss on the run's own curve


def test_command_line_switches_the_norm(capsys) -> None:
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), "--model.norm", "dyt")
    assert config["model"]["norm"] == "dyt"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.nrom", "bhyt"], "nrom"),
        (["--model.lr", "fast"], "model.lr"),
        (["--trainer.max_stepz", "3"], "max_stepz"),
    ],
)
def test_bad_recipe_fails_in_the_parser_naming_the_key(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(RECIPES / "tiny.yaml"), *args])
    assert exc.value.code != 0
    assert message in capsys.readouterr().err


def test_bad_yaml_key_in_a_file_fails(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  preset: tiny\n  lambda_attn: 2.0\n")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(RECIPES / "tiny.yaml"), "--config", str(bad)])
    assert "lambda_attn" in capsys.readouterr().err


def test_unknown_norm_fails_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown norm 'bhytt'; registered norms: bhyt, bhyt_exact"):
        main(["fit", "--config", str(RECIPES / "tiny.yaml"), "--model.norm", "bhytt", "--runs_dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing was written


@pytest.mark.slow
def test_tiny_recipe_trains_logs_and_checkpoints(tmp_path: Path) -> None:
    """The embedded default with fewer steps: validation loss falls clearly, logs and checkpoints exist."""
    args = [
        "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path),
        "--trainer.max_steps", "30", "--trainer.val_check_interval", "30", "--trainer.limit_val_batches", "4",
        "--data.init_args.seq_len", "128", "--model.norm", "bhyt", "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    cli = main(args[1:], run=False)  # instantiate only, then drive the trainer
    assert cli.model.config.norm_args["seq_len"] == 128  # linked from data.seq_len
    assert cli.model.hparams.tokenizer == "embedded"
    before = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]["val/loss"]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    after = float(cli.trainer.callback_metrics["val/loss"])
    assert after < before - 1.0, (before, after)
    run = tmp_path / "tiny-bhyt"
    assert (run / "version_0" / "checkpoints" / "last.ckpt").exists()
    events = list(run.glob("version_*/events.out.tfevents.*"))
    assert events, list(run.rglob("*"))


@pytest.mark.slow
def test_fit_then_resume_from_last(tmp_path: Path) -> None:
    common = [
        "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.limit_val_batches", "0",
        "--trainer.enable_progress_bar", "false", "--data.init_args.seq_len", "64", "--data.init_args.batch_size", "4",
    ]  # fmt: skip
    main([*common, "--trainer.max_steps", "6"])
    saved = tmp_path / "tiny-rmsnorm" / "version_0" / "checkpoints" / "last.ckpt"
    assert saved.exists()
    cli = main([*common, "--trainer.max_steps", "9", "--ckpt_path", "last"])
    assert cli.trainer.global_step == 9
    # the resume continues its run version: one folder, one TensorBoard curve
    assert (tmp_path / "tiny-rmsnorm" / "version_0" / "config.yaml").exists()
    assert not (tmp_path / "tiny-rmsnorm" / "version_1").exists()
    # the other Lightning subcommands on the same checkpoint
    evaluate = [
        "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
        "--data.init_args.seq_len", "64", "--data.init_args.batch_size", "4", "--ckpt_path", str(saved),
    ]  # fmt: skip
    for sub, limit in (("validate", "limit_val_batches"), ("test", "limit_test_batches")):
        cli = main([sub, *evaluate, f"--trainer.{limit}", "2"])
        assert cli.trainer.callback_metrics[f"{'val' if sub == 'validate' else 'test'}/loss"] < 9.0
    cli = main(["predict", *evaluate, "--trainer.limit_predict_batches", "2"])
    scores = cli.trainer.predict_loop.predictions
    assert len(scores) == 2 and scores[0]["nll"].shape == (4,) and bool((scores[0]["tokens"] == 64).all())


def _command_line(monkeypatch: pytest.MonkeyPatch, capsys, *args: str) -> str:
    """Run ``python -m bhyt_pl`` in-process as the command line does; return stderr after the exit."""
    monkeypatch.setattr(sys, "argv", ["bhyt_pl", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.norm", "bhytt"], "unknown norm 'bhytt'; registered norms: bhyt, bhyt_exact"),
        (["--model.preset", "tinyy"], "unknown model preset 'tinyy'; presets: llama-374m"),
        (["--model.norm", "bhyt", "--model.norm_args", "{lambda_atn: 1.0}"],
         "norm 'bhyt' has no argument(s) 'lambda_atn'; its arguments: lambda_attn, lambda_mlp"),
        (["--model.norm", "bhyt", "--model.norm_args", "{lambda_attn: fast}"],
         "norm 'bhyt' argument(s) of the wrong type: lambda_attn='fast' (str) is not float"),
    ],
)  # fmt: skip
def test_config_errors_print_one_short_message(args, expected, tmp_path: Path, monkeypatch, capsys) -> None:
    """They printed a 35-75 line traceback (a bad norm_args value: ``'>' not supported``, no field named)."""
    err = _command_line(monkeypatch, capsys, "fit", "--config", str(RECIPES / "tiny.yaml"), *args,
                        "--runs_dir", str(tmp_path))  # fmt: skip
    assert expected in err and "Traceback" not in err and len(err.splitlines()) <= 3, err
    assert not any(tmp_path.iterdir())


def test_yaml_syntax_error_names_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    bad = tmp_path / "overlay.yaml"
    bad.write_text("model:\n  preset: tiny\n norm: [bhyt\n")
    err = _command_line(monkeypatch, capsys, "fit", "--config", str(RECIPES / "tiny.yaml"), "--config", str(bad))
    assert f"YAML syntax error in {str(bad)!r}" in err and "line 3" in err and "Traceback" not in err


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    """It failed with ``KeyError: 101`` or an unpickling opcode."""
    notes = tmp_path / "notes.ckpt"
    notes.write_text("these are my notes\n")
    err = _command_line(monkeypatch, capsys, "fit", "--config", str(RECIPES / "tiny.yaml"), "--ckpt_path", str(notes))
    assert f"{str(notes)!r} is not a checkpoint" in err and "Traceback" not in err
    assert "mmap" not in err and len(err.splitlines()) == 1, err  # it quoted torch's mmap advice


def test_a_read_only_checkpoint_folder_fails_before_training(tmp_path: Path, monkeypatch, capsys) -> None:
    """It failed only at the first save, after the steps before it were computed."""
    import tempfile

    def refuse(*args, dir=None, **kwargs):  # noqa: A002 - tempfile's own argument name
        raise PermissionError(errno.EACCES, "Permission denied", dir)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)  # root ignores chmod: refuse the probe instead
    args = ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.max_steps", "2",
            "--data.init_args.seq_len", "16", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    err = _command_line(monkeypatch, capsys, *args)
    folder = tmp_path / "tiny-rmsnorm" / "version_0" / "checkpoints"
    assert f"cannot write checkpoints to {str(folder)!r}: Permission denied" in err and "Traceback" not in err
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_read_only_runs_dir_is_one_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A 55-line traceback with exit 1 (root ignores chmod: the folder creation is refused instead)."""
    import bhyt_pl.runs

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(bhyt_pl.runs.os, "mkdir", read_only)
    err = _command_line(monkeypatch, capsys, "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir",
                        str(tmp_path), "--trainer.max_steps", "2")  # fmt: skip
    expected = f"error: cannot create the run folder {str(tmp_path / 'tiny-rmsnorm')!r}: Read-only file system; make"
    assert err.startswith(expected) and "--runs_dir" in err and len(err.splitlines()) == 1, err


def test_a_run_failing_at_its_first_step_leaves_no_orphan_folder(tmp_path: Path) -> None:
    """It left version_0 (an event file, config.yaml): the next run took version_1, and ``--ckpt_path last``
    had a version without a checkpoint to look past."""
    args = ["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.max_steps", "2",
            "--data.init_args.seq_len", "16", "--trainer.enable_progress_bar", "false"]  # fmt: skip

    class Fail(L.Callback):
        def on_train_batch_start(self, *args) -> None:
            raise RuntimeError("a bug in the first step")

    cli = main(args, run=False)
    cli.trainer.callbacks.insert(0, Fail())
    with pytest.raises(RuntimeError, match="a bug in the first step"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert not list(tmp_path.rglob("version_*"))
    assert not (tmp_path / "tiny-rmsnorm").exists()  # nor an empty run folder
    cli = main(args, run=False)
    assert cli.trainer.logger.log_dir == str(tmp_path / "tiny-rmsnorm" / "version_0")


def test_a_run_failing_in_setup_leaves_no_empty_run_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    """It removed version_0 but left an empty runs/tiny-rmsnorm/; a folder with other versions stays."""
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "c4-train.00000-of-00001.json.gz").write_text("not gzip")
    runs = tmp_path / "runs"
    args = ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(runs), "--trainer.max_steps", "2",
            "--data.init_args.data_files", str(shards), "--trainer.enable_progress_bar", "false"]  # fmt: skip
    err = _command_line(monkeypatch, capsys, *args)
    assert "no shard is readable" in err and list(runs.iterdir()) == []
    (runs / "tiny-rmsnorm" / "version_0" / "checkpoints").mkdir(parents=True)
    (runs / "tiny-rmsnorm" / "version_0" / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's")
    _command_line(monkeypatch, capsys, *args)
    assert sorted(p.name for p in (runs / "tiny-rmsnorm").iterdir()) == ["version_0"]


def test_a_full_disk_is_reported_plainly(tmp_path: Path, monkeypatch) -> None:
    """torch buried ``No space left on device`` in a chained ``inline_container`` error without the file."""
    import tempfile

    from bhyt_pl.checkpoint_io import AtomicCheckpointIO

    def full_device(*args, dir=None, **kwargs):  # noqa: A002
        return os.open("/dev/full", os.O_WRONLY), str(Path(dir) / ".last.ckpt.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", full_device)
    target = tmp_path / "last.ckpt"
    with pytest.raises(OSError) as err:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10_000)}, target)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(target)
    assert user_error_message(RuntimeError("trainer failed")) is None  # other errors keep their traceback
    wrapped = RuntimeError("Trainer.fit failed")
    wrapped.__cause__ = err.value
    assert user_error_message(wrapped).startswith(f"No space left on device while writing {target} (")
    assert "was free when the save failed; a checkpoint needs about 40.0 KB). Free space" in user_error_message(wrapped)
    # the message about a previous checkpoint is true: it said "intact" when there was none
    assert "no last.ckpt was written" in user_error_message(wrapped) and "intact" not in user_error_message(wrapped)
    target.write_bytes(b"previous")
    assert "the previous last.ckpt is intact" in user_error_message(wrapped)


def test_too_little_free_space_fails_before_training_and_leaves_no_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    """A full disk was found at the first save, after the work; the failed run left an orphan version_0."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))  # 1 MB free
    args = ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.max_steps", "2",
            "--data.init_args.seq_len", "16", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    err = _command_line(monkeypatch, capsys, *args)
    folder = tmp_path / "tiny-rmsnorm" / "version_0" / "checkpoints"
    # the tiny preset: its parameters in fp32, and AdamW's two moments of the same size
    from bhyt_pl.module import LlamaLM

    lm = LlamaLM(preset="tiny", seq_len=16)
    lm.configure_model()
    params = sum(p.numel() for p in lm.parameters())
    need = 3 * 4 * params / 1e6
    assert (
        f"not enough free disk space for checkpoints in {str(folder)!r}: one checkpoint needs about {need:.1f} MB"
        in err
        and "1.0 MB is free" in err
        and len(err.splitlines()) == 1
    ), err
    assert not list(tmp_path.rglob("version_*"))  # the folder the run claimed is removed


def test_an_error_every_rank_raises_is_printed_by_rank_0_only(tmp_path: Path, monkeypatch, capsys) -> None:
    """Under DDP the free-space refusal was printed twice, once by each rank (rank 0 broadcasts it)."""
    import shutil
    from collections import namedtuple

    from lightning.pytorch.utilities import rank_zero_only

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))  # 1 MB free
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # as the process of rank 1 sees it
    args = ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.max_steps", "2",
            "--data.init_args.seq_len", "16", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    assert _command_line(monkeypatch, capsys, *args) == ""  # exit status 2, silently


def test_a_parse_error_is_not_buried_under_the_usage(capsys) -> None:
    """jsonargparse printed about 80 lines of usage before the error line."""
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(RECIPES / "tiny.yaml"), "--model.nrom", "bhyt"])
    err = capsys.readouterr().err
    assert "error: " in err and "nrom" in err and "usage:" not in err and len(err.splitlines()) <= 3, err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trainer.max_steps", "-5"], "`max_steps` must be a non-negative integer or -1"),
        (["--data.init_args.batch_size", "0"],
         "error: invalid C4DataModule arguments: batch_size must be a positive int, got 0"),
        (["--model.nrom", "bhyt"],
         "unrecognized arguments: --model.nrom bhyt; did you mean --model.norm? (options: "),
        (["--model.overrides", "{n_layers:1}"],
         "error: --model.overrides: Expected a <class 'dict'> (got {n_layers:1}) (options: "),
    ],
    ids=["max_steps", "batch_size", "unknown-key", "not-a-mapping"],
)  # fmt: skip
def test_bad_settings_are_one_error_line(args, expected, tmp_path: Path, monkeypatch, capsys) -> None:
    """``max_steps -5``: a 32-line traceback, exit 1; ``batch_size 0``: a 9-line dump of the union's subtypes
    and the namespace; parse errors named ``__main__.py fit --help``."""
    err = _command_line(monkeypatch, capsys, "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path),
                        *args)  # fmt: skip
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and expected in err, err
    assert "__main__" not in err and not any(tmp_path.iterdir())
    assert "(options: " not in expected or f"(options: {python_command()} -m bhyt_pl fit --help)" in err


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_an_abbreviated_option_is_an_error_naming_the_option(subcommand: str, tmp_path: Path, monkeypatch, capsys):
    """``fit --trainer.max_step 10`` trained 10 steps: argparse's prefix matching read it as ``--trainer.max_steps``."""
    base = [subcommand, "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path)]
    err = _command_line(monkeypatch, capsys, *base, "--trainer.max_step", "10")
    assert err == (
        "error: unrecognized arguments: --trainer.max_step 10; did you mean --trainer.max_steps? "
        f"(options: {python_command()} -m bhyt_pl {subcommand} --help)\n"
    )
    err = _command_line(monkeypatch, capsys, *base, "--trainer.max_st=10", "--ckpt")
    assert "unrecognized arguments: --trainer.max_st=10 --ckpt" in err and not any(tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_:
        main([*base, "--trainer.max_steps", "10", "--print_config"])
    assert exit_.value.code in (0, None) and yaml.safe_load(capsys.readouterr().out)["trainer"]["max_steps"] == 10


def test_an_abbreviated_option_is_an_error_without_a_subcommand_too(tmp_path: Path, capsys) -> None:
    args = ["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        main([*args, "--trainer.max_step", "10"], run=False)
    assert "did you mean --trainer.max_steps?" in capsys.readouterr().err
    assert main([*args, "--trainer.max_steps", "10"], run=False).trainer.max_steps == 10


def test_saved_configs_naming_the_old_checkpoint_io_module_still_load(tmp_path: Path) -> None:
    """``config.yaml`` files written before the rename name ``bhyt_pl.distributed.AtomicCheckpointIO``."""
    from bhyt_pl.checkpoint_io import AtomicCheckpointIO

    args = ["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path)]
    cli = main([*args, "--trainer.plugins", "[{class_path: bhyt_pl.distributed.AtomicCheckpointIO}]"], run=False)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    default = main(args, run=False)  # the CLI's own default now names bhyt_pl.checkpoint_io
    assert type(default.trainer.strategy.checkpoint_io) is AtomicCheckpointIO


def test_the_model_summary_shows_the_training_flops_of_the_throughput_monitor(tmp_path: Path, caplog) -> None:
    """It printed ``0 Total Flops`` (Lightning counts FLOPs only through an ``example_input_array``)."""
    from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

    from bhyt_pl.callbacks.summary import RunModelSummary

    args = ["--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "0", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2",
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
    cli = main(args, run=False)
    assert sum(isinstance(cb, RunModelSummary) for cb in cli.trainer.callbacks) == 1
    with caplog.at_level("INFO"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    flops = cli.model.flops_per_batch  # what TokenThroughputMonitor divides by the batch time
    assert flops > 0
    line = rf"\n{get_human_readable_count(int(flops))} +Training FLOPs per batch and device"
    assert re.search(line, caplog.text) and "Total Flops" not in caplog.text, caplog.text[-2000:]
    assert "| FLOPs" not in caplog.text  # the per-layer column of zeros is gone


def test_every_distributed_recipe_sets_its_process_group_timeout(capsys) -> None:
    """Lightning passed 30 minutes, so a hung collective idled every GPU that long. Each recipe sets 15 minutes,
    quoted (unquoted, YAML reads h:m:s as a base-60 integer), parsed by the CLI as the timedelta Lightning takes."""
    from datetime import timedelta

    from lightning.pytorch import LightningDataModule

    from bhyt_pl.cli import BHyTCLI
    from bhyt_pl.module import LlamaLM

    class ParseOnly(BHyTCLI):  # the GPU recipes cannot build their trainer here
        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

    with_strategy = [p for p in STRATEGIES if "strategy" in yaml.safe_load(p.read_text())["trainer"]]
    assert {p.stem for p in with_strategy} == {"ddp-8gpu", "fsdp1-8gpu", "fsdp2-8gpu", "fsdp2-cpu"}
    for recipe in with_strategy:
        assert 'timeout: "0:15:00"' in recipe.read_text(), recipe.name
        args = ["--config", str(RECIPES / "tiny.yaml"), "--config", str(recipe)]
        cli = ParseOnly(LlamaLM, LightningDataModule, subclass_mode_data=True, args=args, run=False)
        assert cli.config.trainer.strategy.init_args.timeout == timedelta(minutes=15), recipe.name
    # the CPU recipe builds here: the strategy holds it
    cpu = main(["--config", str(RECIPES / "tiny.yaml"), "--config", str(RECIPES / "distributed" / "fsdp2-cpu.yaml")],
               run=False)  # fmt: skip
    assert cpu.trainer.strategy._timeout == timedelta(minutes=15) and cpu.trainer.num_devices == 2


def _fit_args(runs: Path, steps: int, *extra: str) -> list[str]:
    return ["fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(runs), "--run_name", "r",
            "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--data.init_args.seq_len", "16",
            "--data.init_args.batch_size", "2", "--model.overrides", "{n_layers: 1, dim: 32}", *extra]  # fmt: skip


@pytest.mark.parametrize("how", ["last", "path"])
def test_an_incomplete_checkpoint_is_one_line_naming_the_complete_one(tmp_path: Path, monkeypatch, capsys, how):
    """Resuming from a sharded folder that a kill left half-written printed 234 lines and 6 tracebacks."""
    import torch.distributed.checkpoint as dcp

    main(_fit_args(tmp_path, 2, "--trainer.enable_progress_bar", "false"))
    folder = tmp_path / "r" / "version_0" / "checkpoints"
    good = folder / "epoch=0-step=2.ckpt"
    (folder / "last.ckpt").rename(good)
    broken = folder / "last.ckpt"
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):  # one process writes every shard
        dcp.save({"state_dict": {"w": torch.randn(64, 64)}}, checkpoint_id=str(broken))
    torch.save({"global_step": 3}, broken / "meta.pt")
    (shard,) = broken.glob("*.distcp")
    full = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(full // 2)
    before = sorted(tmp_path.rglob("*"))
    err = _command_line(monkeypatch, capsys, *_fit_args(tmp_path, 4, "--ckpt_path", "last" if how == "last" else
                                                        str(broken)))  # fmt: skip
    from bhyt_pl.checkpoint_io import human_size

    assert err == (
        f"error: {str(broken)!r} is an incomplete checkpoint: shard {shard.name} is truncated ({human_size(full // 2)} "
        f"of the {human_size(full)} .metadata names); the newest complete checkpoint beside it is {str(good)!r} "
        f"(step 2)\n"
    )
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def _subprocess_fit(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    from distributed_jobs.launch import clean_env

    return subprocess.run(
        [sys.executable, "-m", "bhyt_pl", *_fit_args(tmp / "runs", 4, *extra)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_full_disk_during_training_is_a_line_of_its_own(tmp_path: Path) -> None:
    """The error was printed at the end of the progress bar's line (the bar writes ``\\r`` without a newline)."""
    proc = _subprocess_fit(tmp_path, "--checkpoint.every_n_train_steps", "1", "--trainer.callbacks+",
                           "kill_points.KillAt", "--trainer.callbacks.point", "rank0_disk_full",
                           "--trainer.callbacks.step", "2")  # fmt: skip
    last = tmp_path / "runs" / "r" / "version_0" / "checkpoints" / "last.ckpt"
    lines = proc.stdout.rstrip("\n").split("\n")  # stdout and stderr as a terminal shows them
    assert proc.returncode == 2 and lines[-1].startswith(
        f"error: No space left on device while saving {last} at step 2 ("
    ), proc.stdout[-3000:]
    assert lines[-1].endswith(
        f"). Free space, or write the run elsewhere with --runs_dir; the previous checkpoint {last} (step 1) is intact"
    ), proc.stdout[-3000:]
    assert "Step" in lines[-2] and "Traceback" not in proc.stdout  # the bar's line, ended


@pytest.mark.slow
def test_an_unexpected_error_keeps_its_traceback_and_points_to_train_log(tmp_path: Path) -> None:
    proc = _subprocess_fit(tmp_path, "--trainer.enable_progress_bar", "false", "--trainer.callbacks+",
                           "lm_fixtures.FailAt", "--trainer.callbacks.step", "2")  # fmt: skip
    log = tmp_path / "runs" / "r" / "version_0" / "train.log"
    lines = proc.stdout.rstrip("\n").split("\n")
    assert proc.returncode == 1 and "Traceback (most recent call last):" in proc.stdout, proc.stdout[-3000:]
    assert lines[-1] == f"error: the run stopped on the RuntimeError above; traceback and log in {log}"
    assert "RuntimeError: a bug at step 2" in log.read_text()

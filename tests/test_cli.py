"""The CLI: every recipe parses, bad recipes fail before work, the embedded default trains and checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bhyt_pl.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
OVERLAY_DIRS = ("norms", "distributed")
BASES = sorted(p for p in RECIPES.rglob("*.yaml") if p.parent.name not in OVERLAY_DIRS)
OVERLAYS = sorted((RECIPES / "norms").glob("*.yaml"))
STRATEGIES = sorted((RECIPES / "distributed").glob("*.yaml"))


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
    assert config["model"]["norm"] == "derf" and config["model"]["overrides"] == {"qk_norm": True}
    line = ["--model.norm", "post_ln", "--model.overrides", "{qk_norm: true}"]
    config = _print_config(capsys, "--config", str(RECIPES / "tiny.yaml"), *line)
    assert config["model"]["norm"] == "post_ln" and config["model"]["overrides"] == {"qk_norm": True}


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
    assert (run / "checkpoints" / "last.ckpt").exists()
    events = list(run.glob("version_*/events.out.tfevents.*"))
    assert events, list(run.rglob("*"))


@pytest.mark.slow
def test_fit_then_resume_from_last(tmp_path: Path) -> None:
    common = [
        "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir", str(tmp_path), "--trainer.limit_val_batches", "0",
        "--trainer.enable_progress_bar", "false", "--data.init_args.seq_len", "64", "--data.init_args.batch_size", "4",
    ]  # fmt: skip
    main([*common, "--trainer.max_steps", "6"])
    saved = tmp_path / "tiny-rmsnorm" / "checkpoints" / "last.ckpt"
    assert saved.exists()
    cli = main([*common, "--trainer.max_steps", "9", "--ckpt_path", "last"])
    assert cli.trainer.global_step == 9
    assert (tmp_path / "tiny-rmsnorm" / "version_1" / "config.yaml").exists()
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

"""``python -m bhyt_pl eval``: help, a local suite end to end (table, JSON beside the checkpoint,
TensorBoard scalars, perplexity), lm-eval's own CLI with the registered model, and argument errors."""

from __future__ import annotations

import functools
import json
import sys

import pytest
from lm_eval.tasks import TaskManager
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bhyt_pl.cli import main as cli_main
from bhyt_pl.eval import PAPER_TASKS, main
from bhyt_pl.eval.command import build_parser, tensorboard_scalars


def test_help_and_paper_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["eval", "--help"])
    assert exit_info.value.code == 0
    assert "--ckpt_path" in capsys.readouterr().out
    args = build_parser().parse_args(["--ckpt_path", "x.ckpt"])
    assert args.num_fewshot == 3 and args.tasks is None
    assert PAPER_TASKS == (
        "arc_challenge",
        "arc_easy",
        "piqa",
        "hellaswag",
        "openbookqa",
        "winogrande",
        "mmlu",
        "boolq",
    )


def test_a_shortened_flag_is_refused_not_read_as_the_flag_it_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--ckpt_path", "x.ckpt", "--task", "arc_easy"])  # not --tasks
    assert exit_info.value.code == 2 and "unrecognized arguments: --task arc_easy" in capsys.readouterr().err


def test_local_suite_end_to_end(small_checkpoint, embedded_suite, capsys):
    code = main(
        [
            "--ckpt_path", str(small_checkpoint),
            "--include_path", str(embedded_suite),
            "--tasks", "kjv_next_verse,kjv_word_order",
            "--limit", "4",
            "--num_fewshot", "1",
            "--batch_size", "4",
            "--perplexity", "c4",
            "--ppl_data_files", "c4=embedded",
            "--ppl_max_documents", "2",
            "--bootstrap_iters", "10",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "kjv_next_verse" in out and "acc" in out and "perplexity c4:" in out
    saved = json.loads(small_checkpoint.with_name("last.eval.json").read_text())
    assert set(saved["results"]) == {"kjv_next_verse", "kjv_word_order"}
    assert saved["perplexity"]["c4"]["documents"] == 2 and saved["perplexity"]["c4"]["token_perplexity"] > 1
    assert saved["checkpoint"]["global_step"] == 7 and saved["checkpoint"]["norm"] == "bhyt"
    events = EventAccumulator(str(small_checkpoint.parent.parent / "version_0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"eval/kjv_next_verse/acc", "eval/kjv_next_verse/acc_norm", "eval/ppl/c4/token_perplexity"} <= tags
    assert events.Scalars("eval/kjv_word_order/acc")[0].step == 7


def test_lm_eval_cli_runs_the_registered_model(small_checkpoint, embedded_suite, monkeypatch, tmp_path):
    from bhyt_pl.eval import harness

    argv = ["lm_eval", "run", "--model", "bhyt_pl", "--model_args", f"ckpt_path={small_checkpoint}",
            "--tasks", "kjv_word_order", "--include_path", str(embedded_suite), "--limit", "3",
            "--output_path", str(tmp_path / "out")]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    # lm-eval's CLI always indexes its ~10k built-in task YAMLs too (a minute here); only ours are needed
    monkeypatch.setattr("lm_eval.tasks.TaskManager", functools.partial(TaskManager, include_defaults=False))
    harness.main()
    assert list((tmp_path / "out").rglob("results_*.json"))


def test_tensorboard_scalar_names():
    results = {
        "results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.1, "em,strict": 1.0}},
        "perplexity": {"wikitext2": {"token_perplexity": 12.5}},
    }
    assert tensorboard_scalars(results) == {
        "eval/arc_easy/acc": 0.5,
        "eval/arc_easy/em_strict": 1.0,
        "eval/ppl/wikitext2/token_perplexity": 12.5,
    }


def test_argument_errors(small_checkpoint, tmp_path):
    base = ["--ckpt_path", str(small_checkpoint), "--tensorboard_dir", "none"]
    with pytest.raises(ValueError, match="SOURCE=PATH pairs"):
        main([*base, "--tasks", "none", "--perplexity", "c4", "--ppl_data_files", "embedded"])
    with pytest.raises(ValueError, match="names source"):
        main([*base, "--tasks", "none", "--perplexity", "c4", "--ppl_data_files", "wikitext2=x.raw"])
    with pytest.raises(ValueError, match="nothing to evaluate"):
        main([*base, "--tasks", "none"])
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        main([*base, "--include_path", str(tmp_path / "missing")])


@pytest.mark.parametrize("world_size", ["2", "1"])
def test_a_launch_as_one_of_several_processes_is_one_error_line(world_size, tmp_path, monkeypatch, capsys) -> None:
    """Under torchrun every process evaluated every example and wrote the same result files."""
    missing = tmp_path / "missing.ckpt"
    monkeypatch.setenv("WORLD_SIZE", world_size)
    monkeypatch.setattr(sys, "argv", ["bhyt_pl", "eval", "--ckpt_path", str(missing), "--tasks", "none"])
    with pytest.raises(SystemExit) as exit_info:
        cli_main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    if world_size == "2":
        assert err == (
            "error: python -m bhyt_pl eval runs on one process, but this one was launched as one of WORLD_SIZE=2 (by "
            "torchrun or another launcher): run it without the launcher, and pick the GPU with --device\n"
        )
    else:  # one process: it goes on, to the missing checkpoint
        assert "WORLD_SIZE" not in err and str(missing) in err and len(err.splitlines()) == 1, err


def test_auto_tensorboard_dir_is_the_checkpoints_own_run_version(tmp_path) -> None:
    from bhyt_pl.eval.command import _tensorboard_dir

    run = tmp_path / "runs" / "tiny-bhyt"
    for n in (0, 1, 2):
        (run / f"version_{n}" / "checkpoints").mkdir(parents=True)
    ckpt = run / "version_1" / "checkpoints" / "last.ckpt"
    assert _tensorboard_dir("auto", ckpt) == (run / "version_1").resolve()
    legacy = run / "checkpoints" / "last.ckpt"  # the older layout: the newest version beside it
    assert _tensorboard_dir("auto", legacy) == (run / "version_2").resolve()

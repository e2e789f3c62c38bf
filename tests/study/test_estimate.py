"""``study --dry-run`` (bhyt_pl.study.cli.estimate): the run range against a hand count and against the protocol itself
(``run_depth_study`` with fake runs), FLOPs and GPU-hours against the formula, option checks, the CPU probe, and a
dry run that trains and writes nothing."""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bhyt_pl.config import LlamaConfig
from bhyt_pl.errors import UsageError
from bhyt_pl.study import main as study_main
from bhyt_pl.study.cli import estimate
from bhyt_pl.study.cli import exploration as command
from bhyt_pl.study.launch.execution import run_depth_study
from bhyt_pl.study.launch.inline import InlineLauncher
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.design import SchemeGroup, Selection
from bhyt_pl.study.protocol.plan import evaluation_specs, selection_specs
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, run_dirname, run_label

SMALL = ["--schemes", "rmsnorm", "layernorm", "--lrs", "1e-3", "3e-3", "--seeds", "2"]
TINY = ["--preset", "tiny", "--layers", "2", "--steps", "4", "--batch-size", "2", "--seq-len", "16", "--no-compile"]


def _setup(tmp_path: Path, *argv: str) -> command.StudySetup:
    """The setup the study command builds."""
    return command.prepare([*argv, "--out", str(tmp_path / "study")])


def test_run_range_matches_a_hand_count(tmp_path: Path) -> None:
    # 2 schemes x 2 rates x 2 evaluation seeds, 1 extension a group.
    # selection: 2 groups x 1 candidate x 2 rates = 4.
    # extensions: each group's one candidate may step once past an edge: 0..2.
    # evaluation, default matched rates = both grid rates (the two highest that trained):
    #   best rate on the grid: 2 rates x 2 seeds = 4 a group -> 8; best rate an extension: 3 rates x 2 seeds -> 12.
    runs = estimate.run_range(_setup(tmp_path, *SMALL, "--extensions", "1").design())
    assert (runs.selection, runs.extensions, runs.evaluation_min, runs.evaluation_max) == (4, 2, 8, 12)
    assert (runs.minimum, runs.maximum) == (12, 18)
    # no extension: the best rate is always one of the two matched rates: 4 + 8 exactly
    runs = estimate.run_range(_setup(tmp_path, *SMALL, "--extensions", "0").design())
    assert (runs.minimum, runs.maximum) == (12, 12)
    # one matched rate 3e-3: best 3e-3 -> 1 rate x 2 seeds a group (4); best elsewhere -> 2 rates x 2 seeds (8)
    setup = _setup(tmp_path, *SMALL, "--extensions", "1", "--matched-lrs", "3e-3")
    runs = estimate.run_range(setup.design(), setup.options.matched_lrs)
    assert (runs.minimum, runs.maximum) == (4 + 4, 4 + 2 + 8)
    # the default study as docs/depth_study.md counts it: 33 selection runs, up to 9 extensions, 27 x 2..3
    runs = estimate.run_range(_setup(tmp_path).design())
    assert (runs.selection, runs.extensions, runs.evaluation_min, runs.evaluation_max) == (33, 9, 54, 81)


def _protocol_count(setup: command.StudySetup, loss, tmp_path: Path) -> int:
    """The runs ``run_depth_study`` submits when each run's validation loss is ``loss(spec)`` (nothing trains)."""
    scheduler = Scheduler(InlineLauncher(lambda spec: RunResult(spec, val_loss=loss(spec))), tmp_path, resume=False)
    run_depth_study(setup.design(), setup.base, scheduler, matched_lrs=setup.options.matched_lrs)
    return scheduler.submitted


def test_run_range_brackets_the_protocol_and_both_ends_are_reached(tmp_path: Path) -> None:
    argv = ("--schemes", "rmsnorm", "dyt:alpha_attn=0.5|1.0", "--lrs", "1e-3", "3e-3", "1e-2", "--seeds", "2")
    setup = _setup(tmp_path, *argv, "--extensions", "2")
    runs = estimate.run_range(setup.design())
    # hand count: selection (1 + 2 candidates) x 3 rates = 9; extensions 2 a group = 4;
    # evaluation 2 seeds x (2 matched + best off them) = 2 x 2..3 a group -> 8..12
    assert (runs.minimum, runs.maximum) == (9 + 8, 9 + 4 + 12)
    # lowest loss at the middle rate 3e-3 (a matched one): no extension, the fewest runs
    assert _protocol_count(setup, lambda s: abs(math.log(s.lr / 3e-3)), tmp_path) == runs.minimum
    # loss falling with the rate: every group extends upwards twice and keeps an off-grid rate: the most runs
    assert _protocol_count(setup, lambda s: -s.lr, tmp_path) == runs.maximum
    rng = random.Random(0)
    for _ in range(40):  # any finite losses: inside the range
        table: dict[str, float] = {}
        count = _protocol_count(setup, lambda s: table.setdefault(s.label, rng.random()), tmp_path)
        assert runs.minimum <= count <= runs.maximum


def _flops_per_token(c: LlamaConfig, seq_len: int) -> float:
    """6 x matmul parameters + 12 x L x H x hd x T (attention scores and values, forward + backward)."""
    attention = c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
    params = c.n_layers * (attention + 3 * c.dim * c.mlp_dim) + c.vocab_size * c.dim
    return 6 * params + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len


def test_flops_and_gpu_hours_follow_the_formula(tmp_path: Path) -> None:
    setup = _setup(tmp_path, *SMALL, "--extensions", "1", "--steps", "10", "--batch-size", "4", "--seq-len", "32")
    cost = estimate.study_cost(setup)
    tokens = 10 * 4 * 32
    per_run = _flops_per_token(setup.config, 32) * tokens
    assert cost.tokens_per_run == tokens
    assert cost.flops_per_run == pytest.approx((per_run,))
    assert (cost.flops_min, cost.flops_max) == pytest.approx((12 * per_run, 18 * per_run))
    # one GPU-hour: 0.4 x 989e12 FLOP/s for 3600 s
    assert estimate.gpu_hours(0.4 * 989e12 * 3600, 0.4, 989) == pytest.approx(1.0)
    assert estimate.gpu_hours(3 * 0.5 * 312e12 * 3600, 0.5, 312) == pytest.approx(3.0)
    text = estimate.dry_run_text(setup, mfu=0.5, peak_tflops=100)
    hours = (12 * per_run / (0.5 * 100e12 * 3600), 18 * per_run / (0.5 * 100e12 * 3600))
    one = per_run / (0.5 * 100e12 * 3600)
    assert f"GPU-hours at 50% MFU of 100 TFLOP/s: {one:.3g} a run; in total {hours[0]:.3g} to {hours[1]:.3g}" in text
    assert "runs: 12 to 18" in text and "CPU time: unknown" in text


def test_sweep_flops_sum_over_its_depths(tmp_path: Path) -> None:
    setup = _setup(tmp_path, "--sweep", "--schemes", "rmsnorm", "--depths", "2", "4", "--lrs", "1e-2", "--seeds", "1")
    cost = estimate.study_cost(setup)
    tokens = setup.budget.steps * setup.budget.batch_size * setup.budget.seq_len
    expected = sum(_flops_per_token(LlamaConfig.from_name(setup.budget.preset, n_layers=d), 64) for d in (2, 4))
    assert (cost.runs.minimum, cost.runs.maximum) == (2, 2)
    assert cost.flops_min == cost.flops_max == pytest.approx(expected * tokens)


def test_the_dry_run_prints_the_parameter_counts_and_tokens_per_parameter(tmp_path: Path) -> None:
    # deep-32x128 (the default preset), 180 steps x 8 x 64 = 92,160 tokens. P = 32 x (128 x 32 x (8 + 4) + 3 x 128
    # x 384) = 32 x 196,608; embedding 8192 x 128; all: P + embedding + the norms' gains, RMSNorm's 32 x 2 x 128 + 128
    # = 8,320, Peri-LN's another 32 x 2 x 128 (a norm after each sublayer too) = 16,512
    setup = _setup(tmp_path, "--schemes", "rmsnorm", "peri_ln", "--lrs", "1e-3", "--seeds", "1")
    text = estimate.dry_run_text(setup)
    assert (
        "parameters (bhyt_pl/model_size.py): 6,291,456 in block matrices (P), 7,348,352 to 7,356,544 in all (the "
        "schemes' norm parameters differ), 1,048,576 embedding; tokens per run 92,160 = 0.0146 tokens per parameter "
        "(T/P)\n"
    ) in text
    assert "epochs" not in text  # 92,160 tokens: under one pass over the embedded corpus


def test_the_dry_run_prints_epochs_past_the_training_data(tmp_path: Path) -> None:
    # deep-16x64: P = 16 x (4096 + 2048 + 2048 + 4096 + 3 x 64 x 192) = 786,432; embedding 8192 x 64 = 524,288;
    # all: + 16 x 2 x 64 + 64 = 2,112 RMSNorm gains. 4,000 steps x 8 x 64 = 2,048,000 tokens = 2.604 T/P.
    # One pass over the embedded corpus at 64 + 1 a window: 948,868 // 65 = 14,597 windows, 1,824 batches of 8
    # -> 933,888 tokens; 2,048,000 / 933,888 = 2.193 epochs
    argv = ("--preset", "deep-16x64", "--schemes", "rmsnorm", "--lrs", "1e-3", "--seeds", "1", "--steps", "4000")
    text = estimate.dry_run_text(_setup(tmp_path, *argv))
    assert (
        "parameters (bhyt_pl/model_size.py): 786,432 in block matrices (P), 1,312,832 in all, 524,288 embedding; "
        "tokens per run 2,048,000 = 2.6 tokens per parameter (T/P); past the training data (933,888 tokens a pass): "
        "2,048,000 tokens seen, 933,888 unique, 2.19 epochs\n"
    ) in text


def test_the_sweep_prints_one_size_per_depth(tmp_path: Path) -> None:
    # deep-32x128 at 2 and 4 layers: P = 2 x 196,608 and 4 x 196,608; 40 steps x 4 x 64 = 10,240 tokens (sweep quick)
    setup = _setup(tmp_path, "--sweep", "--quick", "--schemes", "rmsnorm", "--depths", "2", "4", "--seeds", "1")
    text = estimate.dry_run_text(setup)
    assert "parameters at 2 layers (bhyt_pl/model_size.py): 393,216 in block matrices (P), 1,442,432 in all" in text
    assert "10,240 = 0.026 tokens per parameter (T/P)" in text  # 10,240 / 393,216 = 0.02604
    assert "parameters at 4 layers (bhyt_pl/model_size.py): 786,432 in block matrices (P), 1,836,160 in all" in text
    assert "10,240 = 0.013 tokens per parameter (T/P)" in text  # 10,240 / 786,432 = 0.01302


@pytest.mark.parametrize("mfu", ["0", "-0.4", "1.5", "40"])
def test_mfu_outside_the_unit_interval_is_a_usage_error(tmp_path: Path, mfu: str) -> None:
    setup = _setup(tmp_path, *SMALL, "--mfu", mfu)
    with pytest.raises(UsageError, match=r"--mfu must be in \(0, 1\]"):
        estimate.dry_run(setup)
    estimate.check_arguments(_setup(tmp_path, *SMALL, "--mfu", "1").options)  # 100 % is allowed


def test_peak_and_probe_steps_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--peak-tflops must be a finite number > 0") as err:
        estimate.check_arguments(_setup(tmp_path, "--peak-tflops", "0", "--probe-steps", "-1").options)
    assert "--probe-steps must be >= 0" in str(err.value)


def _write_finished(out: Path, spec: RunSpec, val_loss: float) -> None:
    folder = out / "runs" / run_dirname(spec.label)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(RunResult(spec, val_loss=val_loss).to_dict(), default=str))


def test_finished_runs_are_counted_as_the_protocol_would_reuse_them(tmp_path: Path) -> None:
    setup = _setup(tmp_path, *SMALL, "--extensions", "1")
    group = setup.design().groups[0]
    specs = selection_specs(group, (1e-3, 3e-3), setup.base)
    _write_finished(setup.out, specs[0], 4.0)
    assert len(estimate.study_cost(setup).reused) == 1
    # its selection complete with the best rate 3e-3 at the grid's top edge: the extension 9e-3 comes next, so an
    # evaluation run at 3e-3 is not reused yet; once the extension is in (worse), 3e-3 is selected and it is
    _write_finished(setup.out, specs[1], 3.0)
    best = evaluation_specs(group, _selection(group, specs[1]), (), 2, setup.base)[0]
    _write_finished(setup.out, best, 3.1)
    assert len(estimate.study_cost(setup).reused) == 2
    extension = replace(specs[1], label=run_label(specs[1].candidate, 0.009, specs[1].steps, 0), lr=0.009)
    _write_finished(setup.out, extension, 5.0)
    assert len(estimate.study_cost(setup).reused) == 4
    assert estimate.study_cost(_setup(tmp_path, *SMALL, "--restart")).reused == ()


def _selection(group: SchemeGroup, spec: RunSpec) -> Selection:
    return Selection(group.label, RunResult(spec, val_loss=3.0), ())


@pytest.mark.slow
def test_probe_times_real_training_steps(tmp_path: Path) -> None:
    setup = _setup(tmp_path, *TINY, *SMALL)
    spec = selection_specs(setup.groups[0], setup.budget.lrs, setup.base)[0]
    probe = estimate.probe_pace(spec, setup.data, 2, compile=False, threads=1)
    assert probe.steps == 2 and probe.threads == 1
    assert 0 < probe.seconds_per_step < 60 and probe.warmup_seconds > 0
    with pytest.raises(UsageError, match="--probe-steps"):
        estimate.probe_pace(spec, setup.data, 0)


@pytest.mark.slow
def test_dry_run_trains_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dry run trained a study run")

    monkeypatch.setattr("bhyt_pl.study.run.runner.run_one", no_training)
    monkeypatch.chdir(tmp_path)
    argv = [*TINY, *SMALL, "--probe-steps", "2", "--workers", "2", "--out", str(tmp_path / "study"), "--dry-run"]
    levels = [logging.getLogger(name).level for name in estimate.LIGHTNING_LOGGERS]
    with caplog.at_level(logging.INFO):
        assert study_main(argv) == 0
    assert list(tmp_path.iterdir()) == []  # no study folder, no lightning_logs, no checkpoint
    captured = capsys.readouterr()
    text = captured.out
    # the probe's fit says nothing under a header that says nothing trains: no "`Trainer.fit` stopped: ..."
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("lightning")]
    assert "Trainer.fit" not in captured.out + captured.err + caplog.text and "GPU available" not in caplog.text
    assert [logging.getLogger(name).level for name in estimate.LIGHTNING_LOGGERS] == levels  # restored
    assert "runs: 12 to 18" in text
    assert "CPU time at the probe's pace with 2 worker(s)" in text
    assert "2 step(s) timed after a warm-up step" in text and "1 torch thread(s)" in text and "load average" in text


def test_quiet_lightning_holds_back_info_lines_only_and_restores_the_levels(caplog: pytest.LogCaptureFixture) -> None:
    import lightning.pytorch  # noqa: F401 - its logger's level is Lightning's own (INFO)

    fit_loop = logging.getLogger("lightning.pytorch.loops.fit_loop")
    levels = [logging.getLogger(name).level for name in estimate.LIGHTNING_LOGGERS]
    with caplog.at_level(logging.INFO, logger="bhyt_pl"):
        with estimate.quiet_lightning():
            fit_loop.info("`Trainer.fit` stopped: `max_steps=6` reached.")
            fit_loop.warning("a warning still shows")
        fit_loop.info("after the probe: shown again")
    assert [r.getMessage() for r in caplog.records] == ["a warning still shows", "after the probe: shown again"]
    assert [logging.getLogger(name).level for name in estimate.LIGHTNING_LOGGERS] == levels


def test_a_bad_estimate_option_exits_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert study_main(["--dry-run", "--mfu", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--mfu must be in (0, 1]" in capsys.readouterr().err and not (tmp_path / "s").exists()

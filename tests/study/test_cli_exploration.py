"""``python -m bhyt_pl study`` (``bhyt_pl.study.cli.exploration``): a --quick-sized run end to end on a tiny budget
(seeds, LR
selection, claims, trajectories, layer importance), resume, divergence detection, a failing run that does not end
the study, the sweep grid, ``--report-from``, removed flags, argument errors and the setup the bench reuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bhyt_pl.study import main
from bhyt_pl.study.cli import exploration as command
from bhyt_pl.study.cli.exploration import parser, prepare, resolve
from bhyt_pl.study.protocol.design import check_disjoint, parse_group
from bhyt_pl.study.report.tables import group_columns
from bhyt_pl.study.run import runner

# a tiny budget on top of --quick: 2 layers, a few steps of 2 x 32 tokens
TINY = ["--quick", "--layers", "2", "--steps", "3", "--seq-len", "32", "--batch-size", "2", "--val-batches", "4"]
TINY += ["--shuffle-buffer", "4", "--workers", "1", "--no-compile"]  # in this process: monkeypatched runs apply


def _runs(out: Path) -> dict[str, dict]:
    return {r["spec"]["label"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


@pytest.mark.slow
def test_quick_study_protocol_v3_end_to_end_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "study"
    argv = [*TINY, "--seeds", "2", "--lrs", "1e-3", "3e-3", "--trajectory-every", "2", "--steps", "4"]
    argv += ["--schemes", "rmsnorm", "bhyt", "--out", str(out)]
    assert main(argv) == 0
    for name in ("report.md", "results.json", "depth_final.png", "trajectories.png", "claims_over_training.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "layer_importance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((out / "results.json").read_text())
    runs = {r["spec"]["label"]: r for r in document["runs"]}
    design = document["design"]
    # selection: 2 schemes x 2 lrs on the selection seed (no extension with --quick); both rates are matched
    # (every group trained at both), so each group's best rate coincides with one: 2 rates x 2 evaluation seeds
    assert len([label for label in runs if label.endswith("-s0")]) == 4 and len(runs) == 4 + 8
    assert design["matched_lrs"] == [1e-3, 3e-3]
    for group, s in design["selections"].items():
        pool = [runs[label] for label in s["selection_runs"]]
        assert runs[s["run"]]["val_loss"] == min(r["val_loss"] for r in pool)  # lowest validation loss wins
        assert s["budget"] == 2 and s["extensions"] == []
        evaluation = [r for r in runs.values() if r["spec"]["group"] == group and r["spec"]["seed_index"] > 0]
        assert sorted((r["spec"]["lr"], r["spec"]["seed"]) for r in evaluation) == [
            (1e-3, 43),
            (1e-3, 44),
            (3e-3, 43),
            (3e-3, 44),
        ]
    r = runs["rmsnorm@lr0.001-steps4-s1"]
    assert r["status"] == "ok" and r["steps_done"] == 4 and r["n_layers"] == 2 and r["dim"] == 128
    assert [p["step"] for p in r["trajectory"]] == [0, 2, 4]
    for point in r["trajectory"]:
        assert len(point["magnitude"]) == len(point["median_magnitude"]) == len(point["magnitude_top2_removed"]) == 2
        # dropping channels can only shrink every token's norm
        assert all(t < m for t, m in zip(point["magnitude_top2_removed"], point["magnitude"], strict=True))
    # the last trajectory point's loss is the validation loss on the same fixed batches
    assert r["trajectory"][-1]["val_loss"] == pytest.approx(r["val_loss"], rel=1e-4)
    # stability and layer importance: measured on the reported runs only (evaluation seeds at the best rate)
    for group, s in design["selections"].items():
        best_lr = runs[s["run"]]["spec"]["lr"]
        for label, run in runs.items():
            if run["spec"]["group"] != group:
                continue
            if run["spec"]["seed_index"] > 0 and run["spec"]["lr"] == best_lr:
                assert len(run["importance"]) == 2 and math.isfinite(run["importance_base_loss"]), label
                assert run["stability"]["steps"] and run["stability"]["steps"][-1]["max_grad_layer"] in (1, 2)
            else:
                assert not run["importance"] and not run["stability"], label
    claims = {(c["statement"], c["groups"]["target"], c["groups"]["baseline"]): c for c in document["claims"]}
    loss = claims[("BHyT's loss is no worse than RMSNorm's", "bhyt", "rmsnorm")]
    (test,) = loss["tests"]
    assert test["runs"]["target"] == [
        f"{design['selections']['bhyt']['candidate']}@lr{test['lrs']['target']:g}-steps4-s{i}" for i in (1, 2)
    ]
    magnitude = claims[("BHyT has the lowest last-layer magnitude", "bhyt", "rmsnorm")]
    assert [t["rate"] for t in magnitude["tests"]] == ["0.001", "0.003"]
    assert [p["step"] for p in magnitude["tests"][0]["over_training"]] == [0, 2, 4]
    text = (out / "report.md").read_text()
    assert "| " + " | ".join(c.header for c in group_columns()) + " |" in text
    assert "| claim | arm | rate(s) | difference [95 % CI; 90 % for ~] | verdict | Holm-adjusted verdict |" in text
    bound = next(r["variance_bound"] for r in runs.values() if r["variance_bound"])
    assert bound["n_layers"] == 2 and bound["threshold"] == pytest.approx(1 / math.sqrt(2))
    assert "| lr 0.001 | lr 0.003 |" in text and "**" in text
    # the report again from results.json alone: the same text, every figure, no run folder read
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    (rebuilt / "results.json").write_text((out / "results.json").read_text())
    assert main(["--report-from", str(rebuilt)]) == 0
    assert (rebuilt / "report.md").read_text() == text
    assert sorted(p.name for p in rebuilt.glob("*.png")) == sorted(p.name for p in out.glob("*.png"))

    # resume: every run finished, so a second invocation trains nothing and reports the same runs
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(runner, "run_one", no_training)
    before = (out / "results.json").read_text()
    assert main(argv) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["meta"]["runs_reused"] == 12
    assert [r["val_loss"] for r in again["runs"]] == [r["val_loss"] for r in json.loads(before)["runs"]]


@pytest.mark.slow
def test_resume_retrains_only_the_missing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "resume"
    argv = [*TINY, "--seeds", "2", "--lrs", "1e-3", "--steps", "2", "--schemes", "rmsnorm", "--out", str(out)]
    argv += ["--trajectory-every", "0", "--no-importance"]
    assert main(argv) == 0
    # as if killed during the first evaluation seed
    (out / "runs" / "rmsnorm@lr0.001-steps2-s1" / "result.json").unlink()
    trained: list[str] = []
    real = runner.run_one

    def counting(spec, *args, **kwargs):
        trained.append(spec.label)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "run_one", counting)
    assert main(argv) == 0
    assert trained == ["rmsnorm@lr0.001-steps2-s1"]


@pytest.mark.slow
def test_divergent_runs_are_reported_and_keep_partial_logs(tmp_path: Path) -> None:
    out = tmp_path / "diverge"
    # lr 100: the first update wrecks the weights; the study goes on and exits 0 (divergence is a result)
    argv = [*TINY, "--steps", "6", "--lrs", "100", "--seeds", "1", "--no-importance", "--trajectory-every", "0"]
    assert main([*argv, "--schemes", "rmsnorm", "bhyt", "--out", str(out)]) == 0
    runs = _runs(out)
    for label, r in runs.items():
        assert r["status"] == "diverged", label
        assert r["diverged_step"] is not None and r["diverged_step"] < 6
        assert not math.isfinite(r["diverged_loss"]) or r["diverged_loss"] > r["spec"]["max_loss"]
        assert r["steps_done"] == r["diverged_step"]  # stopped there, not trained on
        assert (out / r["log_dir"] / "metrics.csv").read_text().count("\n") >= 2  # header + logged steps
        assert len(r["losses"]) == r["diverged_step"]
    text = (out / "report.md").read_text()
    assert "none trained: " in text and "yes, step" in text and "diverged @" in text


@pytest.mark.slow
def test_a_failing_run_is_recorded_and_the_study_continues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner.LlamaLM

    def flaky(*args, **kwargs):
        if kwargs.get("norm") == "rmsnorm":
            raise RuntimeError("simulated out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "LlamaLM", flaky)
    out = tmp_path / "error"
    argv = [*TINY, "--steps", "2", "--seeds", "1", "--lrs", "1e-3", "--no-importance", "--trajectory-every", "0"]
    assert main([*argv, "--schemes", "rmsnorm", "lns", "--out", str(out)]) == 1
    runs = _runs(out)
    rms, lns = runs["rmsnorm@lr0.001-steps2-s0"], runs["lns@lr0.001-steps2-s0"]
    assert rms["status"] == "error" and "simulated out of memory" in rms["error"]
    assert lns["status"] == "ok"
    assert "error: RuntimeError: simulated out of memory" in (out / "report.md").read_text()


@pytest.mark.slow
def test_quick_sweep_grid(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "sweep"
    argv = ["--sweep", "--quick", "--steps", "2", "--depths", "1", "2", "--lrs", "1e-3", "100", "--seq-len", "32"]
    argv += ["--shuffle-buffer", "4", "--workers", "1", "--no-compile"]
    with caplog.at_level("INFO", logger="bhyt_pl.study.cli.driver"):
        assert main([*argv, "--batch-size", "2", "--schemes", "rmsnorm", "--out", str(out)]) == 0
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("study: run ")]
    assert [m.split(" done")[0] for m in progress] == [f"study: run {k} of 4" for k in (1, 2, 3, 4)]
    assert all(" left" in m for m in progress[:3]) and " left" not in progress[3]
    runs = _runs(out)
    assert sorted(runs) == [
        "rmsnorm@L1-lr0.001-steps2-s0",
        "rmsnorm@L1-lr100-steps2-s0",
        "rmsnorm@L2-lr0.001-steps2-s0",
        "rmsnorm@L2-lr100-steps2-s0",
    ]
    assert {r["status"] for label, r in runs.items() if "lr100" in label} == {"diverged"}
    assert {r["status"] for label, r in runs.items() if "lr0.001" in label} == {"ok"}
    assert [r["n_layers"] for r in runs.values()] == [1, 1, 2, 2]
    text = (out / "report.md").read_text()
    assert "| scheme | layers | lr 0.001 | lr 100 |" in text and "**diverged** @" in text
    assert (out / "sweep_grid.png").stat().st_size > 0
    (out / "report.md").unlink()
    assert main(["--report-from", str(out)]) == 0 and (out / "report.md").read_text() == text


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--steps", "0"], "--steps must be >= 1"),
        (["--override", "dimension"], "must be FIELD=VALUE"),
        (["--override", "not_a_field=3"], "unknown LlamaConfig field"),
        (["--seq-len", "4096"], "exceeds the preset's max_seq_len=512"),
        (["--sweep", "--layers", "4"], "--layers does not apply to --sweep"),
        (["--lrs", "0"], "--lrs must be > 0"),
        (["--lrs", "1e-3", "1e-3"], "--lrs has duplicates"),
        (["--lrs", "1e-3", "0.0010000001"], "--lrs has duplicates .*share a run label"),
        (["--seeds", "0"], "--seeds must be >= 1"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--val-batches", "2"], "--val-batches must be >= 4"),
        (["--extensions", "-1"], "--extensions must be >= 0"),
        (["--matched-lrs", "0"], "--matched-lrs must be > 0"),
        (["--matched-lrs", "1e-3", "3e-3", "1e-3"], "--matched-lrs has duplicates"),
        (["--roles", "DyT"], "must be ROLE=GROUP"),
    ],
)
def test_argument_errors(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve(parser().parse_args(argv))


def test_bad_arguments_exit_2_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--schemes", "nonorm", "--out", str(tmp_path / "x")]) == 2
    assert "unknown scheme 'nonorm'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_misspelt_scheme_argument_is_one_line_naming_it_and_the_accepted_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--schemes", "rmsnorm", "bhyt:lamda_attn=1.0", "--steps", "5", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --schemes 'bhyt:lamda_attn=1.0': norm 'bhyt' has no argument(s) 'lamda_attn'; ")
    assert "its arguments: lambda_attn, lambda_mlp, " in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("flag", "meant"), [("--stpes", "--steps"), ("--step", "--steps"), ("--matched-lr", "--matched-lrs")]
)
def test_a_mistyped_or_shortened_flag_is_one_line_naming_the_flag_meant(
    flag: str, meant: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No usage dump, and no prefix matching: ``--step 5`` is not read as ``--steps 5``."""
    assert main([flag, "5", "--out", str(tmp_path / "x")]) == 2
    expected = f"error: unrecognized argument {flag}; did you mean {meant}? (options: python -m bhyt_pl study --help)"
    assert capsys.readouterr().err == expected + "\n" and not (tmp_path / "x").exists()


def test_a_candidate_in_two_groups_exits_2_naming_both_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Both groups would train runs with the same labels; the second group's would be dropped as duplicates."""
    argv = ["--schemes", "dyt:alpha_attn=0.5|1.0|2.0", "dyt:alpha_attn=1.0", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "candidate 'dyt:alpha_attn=1.0' is in both group 'dyt:alpha_attn=0.5|1.0|2.0' and group" in err
    assert "'dyt:alpha_attn=1.0'; give each candidate in one group only" in err
    assert not (tmp_path / "x").exists()
    groups = [parse_group("dyt:alpha_attn=0.5|1.0"), parse_group("dyt:alpha_attn=2.0|1.0")]
    with pytest.raises(ValueError, match="candidate 'dyt:alpha_attn=1.0' is in both group"):
        check_disjoint(groups)
    check_disjoint([parse_group("dyt:alpha_attn=0.5|1.0"), parse_group("dyt:alpha_attn=2.0")])  # disjoint: fine


def test_quick_defaults_are_smaller_than_full() -> None:
    quick, _ = resolve(parser().parse_args(["--quick"]))
    full, overrides = resolve(parser().parse_args([]))
    assert full.preset == "deep-32x128" and overrides == {}
    assert quick.steps * quick.seq_len * (quick.layers or 32) < full.steps * full.seq_len * 32
    assert full.seeds >= 3 and quick.seeds >= 2 and len(full.lrs) >= 3
    assert full.val_batches >= 4 and quick.val_batches >= 4 and full.extensions == 1


@pytest.mark.parametrize(
    ("flag", "replacement"), [("--seed", "--seeds"), ("--lr", "--lrs"), ("--data-seed", "--seeds")]
)
def test_removed_flags_name_their_replacement(flag: str, replacement: str, capsys: pytest.CaptureFixture) -> None:
    assert main([flag, "3"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} was removed; use {replacement}" in err


def test_help_shows_seeds_lrs_and_workers() -> None:
    text = parser().format_help()
    for flag in ("--seeds", "--lrs", "--workers", "--schemes", "--trajectory-every", "--matched-lrs", "--extensions"):
        assert flag in text
    assert "--seed " not in text and "--lr " not in text  # removed flags stay hidden


def test_workers_default_to_the_cpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    from bhyt_pl.study.launch import pool as local
    from bhyt_pl.study.launch.options import LaunchOptions, check_launcher

    def _options(argv: list[str]) -> LaunchOptions:
        return LaunchOptions.from_values(vars(command.parser().parse_args(argv)))

    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert command.parser().parse_args([]).workers is None  # decided by the launcher: CPUs here, GPUs with one
    assert check_launcher(_options([])) == 3
    assert check_launcher(_options(["--workers", "2"])) == 2
    monkeypatch.delattr(local.os, "sched_getaffinity")
    monkeypatch.setattr(local.os, "cpu_count", lambda: None)
    assert check_launcher(_options([])) == 1


def test_compile_flag_defaults_and_switches() -> None:
    assert command.parser().parse_args([]).compile is command.COMPILE_DEFAULT is True  # the documented default
    assert command.parser().parse_args(["--compile"]).compile is True
    assert command.parser().parse_args(["--no-compile"]).compile is False


def test_prepare_builds_the_setup_main_runs(tmp_path: Path) -> None:
    dyt = "dyt:alpha_attn=0.5|1.0"
    setup = prepare(["--quick", "--schemes", "rmsnorm", dyt, "--roles", f"DyT={dyt}"])
    assert setup.mode == "study-quick" and setup.out == Path("runs/study-quick")
    assert [g.label for g in setup.groups] == ["rmsnorm", "dyt:alpha_attn=0.5|1.0"]
    assert setup.roles["DyT"] == "dyt:alpha_attn=0.5|1.0"
    assert setup.base.steps == command.QUICK.steps and setup.base.overrides == {"n_layers": command.QUICK.layers}
    assert setup.design().lrs == command.QUICK.lrs and setup.design().n_seeds == command.QUICK.seeds
    assert setup.data.seq_len == command.QUICK.seq_len and setup.settings.compile is command.COMPILE_DEFAULT
    meta = setup.meta()
    assert meta["schemes"] == ["rmsnorm", dyt] and meta["roles"] == {"RMSNorm": "rmsnorm", "DyT": dyt}
    assert prepare(["--sweep", "--quick"]).design() is None


def test_report_from_a_folder_without_a_record_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--report-from", str(tmp_path)]) == 2
    assert "--report-from" in capsys.readouterr().err and not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_saying_the_command_resumes_and_the_rerun_reuses_what_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lightning turns Ctrl-C inside a fit into ``sys.exit(1)``; the study leaves with 130, as ``fit`` does, says it
    was interrupted (never "finished") with a report marked partial, and the rerun finishes it with the time of
    both invocations in its record; that report rebuilds from its results.json byte for byte."""
    import signal

    from bhyt_pl.study.run.callbacks import DivergenceMonitor

    out = tmp_path / "s"
    argv = ["--sweep", "--schemes", "rmsnorm", "--depths", "1", "--lrs", "1e-3", "3e-3", "--seeds", "1"]
    argv += ["--steps", "2", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4", "--workers", "1"]
    argv += ["--no-compile", "--out", str(out)]
    original = DivergenceMonitor.on_train_batch_end
    calls = []

    def interrupt_second_run(self, trainer, *args, **kwargs):
        calls.append(trainer.global_step)
        if len(calls) == 3:  # the second run's first step: the first run has finished
            raise KeyboardInterrupt
        return original(self, trainer, *args, **kwargs)

    monkeypatch.setattr(DivergenceMonitor, "on_train_batch_end", interrupt_second_run)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level("INFO"):
            assert main(argv) == 130
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores SIGINT after an interrupt
    messages = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("study finished") for m in messages)
    assert (
        messages[-2].startswith("study interrupted after ") and ", 1 of 2 runs done; partial report: " in messages[-2]
    )
    assert messages[-1] == "this machine's workers stop; the same command resumes it, reusing every finished run"
    report = (out / "report.md").read_text().splitlines()
    assert report[2].startswith("**Partial: 1 of 2 runs.** This study was interrupted before its last run")
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["partial"] == {"runs_done": 1, "runs_planned": 2, "planned_final": True, "state": "interrupted"}
    assert [i["outcome"] for i in meta["invocations"]] == ["interrupted"]
    finished = [p / "result.json" for p in (out / "runs").iterdir() if (p / "result.json").exists()]
    assert [p.parent.name for p in finished] == ["rmsnorm@L1-lr0.001-steps2-s0"]
    first = finished[0].read_text()
    monkeypatch.setattr(DivergenceMonitor, "on_train_batch_end", original)
    assert main(argv) == 0
    assert finished[0].read_text() == first and len(_runs(out)) == 2  # reused, not trained again
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert "partial" not in meta and [i["outcome"] for i in meta["invocations"]] == ["interrupted", "finished"]
    assert meta["wall_seconds"] == pytest.approx(sum(i["wall_seconds"] for i in meta["invocations"]), abs=0.11)
    text = (out / "report.md").read_text()
    assert "Partial" not in text and "- invocations: 2 (" in text
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_bytes((out / "results.json").read_bytes())
    assert main(["--report-from", str(copy)]) == 0 and (copy / "report.md").read_text() == text

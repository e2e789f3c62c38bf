"""``--launcher pool|local|slurm``: the options become the launcher the study's scheduler drives; and the same
2-run study trained by submitit's local executor (real jobs in subprocesses) and by the process pool gives the same
runs, run for run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bhyt_pl.errors import UsageError
from bhyt_pl.study import main
from bhyt_pl.study.cli.exploration import parser
from bhyt_pl.study.launch.cluster_settings import LocalSettings, SlurmSettings
from bhyt_pl.study.launch.inline import InlineLauncher
from bhyt_pl.study.launch.options import (
    LaunchOptions,
    check_launcher,
    cluster_settings,
    make_launcher,
    study_name,
)
from bhyt_pl.study.launch.pool import ProcessPoolLauncher
from bhyt_pl.study.launch.submitit_local import LocalJobLauncher


def _args(*argv: str) -> LaunchOptions:
    return LaunchOptions.from_values(vars(parser().parse_args(list(argv))))


def test_the_pool_needs_no_cluster_settings_and_runs_inline_with_one_worker(tmp_path: Path) -> None:
    args = _args("--workers", "1")
    assert cluster_settings(args) is None and check_launcher(args) == 1
    assert isinstance(make_launcher(args, len, tmp_path, 1), InlineLauncher)
    pool = make_launcher(_args("--workers", "2"), len, tmp_path, 2)
    try:
        assert isinstance(pool, ProcessPoolLauncher)
    finally:
        pool.close()


def test_slurm_options_map_to_submitits_names() -> None:
    args = _args(
        "--launcher", "slurm", "--partition", "gpu", "--account", "proj", "--qos", "high", "--timeout-min", "240",
        "--cpus-per-task", "8", "--mem-gb", "64", "--sbatch", "constraint=a100", "exclusive", "--setup",
        "module load cuda", "--max-concurrent", "16", "--retries", "3", "--accelerator", "gpu",
    )  # fmt: skip
    settings = cluster_settings(args)
    assert isinstance(settings, SlurmSettings)
    assert (settings.partition, settings.account, settings.qos) == ("gpu", "proj", "high")
    assert (settings.timeout_min, settings.cpus_per_task, settings.mem_gb) == (240, 8, 64.0)
    assert settings.gpus_per_node == 1  # a GPU accelerator: one GPU per run unless --gpus-per-run says otherwise
    assert settings.additional_parameters == {"constraint": "a100", "exclusive": True}
    assert settings.setup == ("module load cuda",) and (settings.max_concurrent, settings.retries) == (16, 3)
    parameters = settings.executor_parameters("bhyt-x")
    assert parameters["slurm_partition"] == "gpu" and parameters["slurm_additional_parameters"]["constraint"] == "a100"
    assert cluster_settings(_args("--launcher", "local")).gpus_per_node == 0  # CPU runs ask for no GPU
    assert cluster_settings(_args("--launcher", "local", "--gpus-per-run", "2")).gpus_per_node == 2
    assert check_launcher(args) == 1  # a cluster's jobs run alone, whatever --workers says


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--timeout-min", "0"], "--timeout-min must be an integer >= 1"),
        (["--retries", "-1"], "--retries must be an integer >= 0"),
        (["--gpus-per-run", "-1"], "--gpus-per-run must be an integer >= 0"),
        (["--timeout-min", "1", "--signal-delay-s", "60"], "--signal-delay-s .* must be shorter than the time limit"),
        (["--sbatch", "=x"], "--sbatch '=x' must be FLAG=VALUE"),
    ],
)
def test_bad_cluster_options_name_the_flag(argv: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        cluster_settings(_args("--launcher", "slurm", *argv))


def test_bad_cluster_options_exit_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["--launcher", "local", "--timeout-min", "0", "--out", str(out)]) == 2
    assert "--timeout-min" in capsys.readouterr().err and not out.exists()


def test_jobs_are_named_after_the_study_folder() -> None:
    assert study_name(Path("runs/study-quick")) == "bhyt-study-quick"
    assert study_name(Path("/shared/my study (v2)")) == "bhyt-my-study-v2"


def test_the_local_launcher_is_submitits_and_holds_the_folder(tmp_path: Path) -> None:
    launcher = make_launcher(_args("--launcher", "local", "--timeout-min", "5"), len, tmp_path / "s", None)
    try:
        assert isinstance(launcher, LocalJobLauncher) and launcher.study == "bhyt-s"
        assert isinstance(launcher.settings, LocalSettings) and launcher.settings.timeout_min == 5
        with pytest.raises(UsageError, match="another study driver"):
            launcher.records.__class__(tmp_path / "s").lock()  # a second driver on the folder is refused
    finally:
        launcher.close()


STUDY = ["--sweep", "--quick", "--schemes", "rmsnorm", "--depths", "2", "--lrs", "1e-3", "3e-3", "--seeds", "1"]
STUDY += ["--steps", "4", "--seq-len", "32", "--batch-size", "2", "--shuffle-buffer", "4", "--no-compile"]


def _runs(out: Path) -> dict[str, dict]:
    return {r["spec"]["label"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


@pytest.mark.slow
def test_a_study_through_submitits_local_executor_matches_the_process_pool_run_for_run(tmp_path: Path) -> None:
    """Two runs as real local jobs (one CPU each, a time limit a loaded machine cannot reach) and the same two in a
    2-worker pool (one torch thread each): the same runs, to the bit."""
    local, pool = tmp_path / "local", tmp_path / "pool"
    jobs = ["--launcher", "local", "--timeout-min", "20", "--max-concurrent", "2", "--cpus-per-task", "1"]
    assert main([*STUDY, *jobs, "--poll-interval-s", "0.5", "--out", str(local)]) == 0
    assert main([*STUDY, "--launcher", "pool", "--workers", "2", "--out", str(pool)]) == 0
    by_job, by_pool = _runs(local), _runs(pool)
    assert sorted(by_job) == sorted(by_pool) == ["rmsnorm@L2-lr0.001-steps4-s0", "rmsnorm@L2-lr0.003-steps4-s0"]
    for label, run in by_job.items():
        other = by_pool[label]
        assert run["status"] == other["status"] == "ok" and run["spec"] == other["spec"]
        assert run["losses"] == other["losses"] and len(run["losses"]) == 4
        assert (run["train_loss"], run["steps_done"]) == (other["train_loss"], other["steps_done"])
        print(f"{label}: local job train loss {run['train_loss']!r}, pool {other['train_loss']!r}")
    records = [json.loads(line) for line in (local / "jobs.jsonl").read_text().splitlines()]
    assert sorted((r["event"], r["label"]) for r in records) == sorted(
        (event, label) for label in by_job for event in ("submitted", "done")
    )
    assert not (pool / "jobs.jsonl").exists()

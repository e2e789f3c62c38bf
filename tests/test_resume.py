"""Runs lose no work: the final step and interrupted steps are saved, ``--ckpt_path last`` finds the
newest version (or says where it looked), a resume continues its own version folder and refuses a
different configuration, and the progress bar counts steps out of ``max_steps``."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from bhyt_pl.callbacks.checkpointing import StoppedByCtrlC
from bhyt_pl.cli import default_run_name, main
from bhyt_pl.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
TINY = "{n_layers: 1, dim: 32, n_heads: 2, n_kv_heads: 1, mlp_dim: 64}"
RUN = default_run_name("tiny", "rmsnorm", yaml.safe_load(TINY))
"""The default run name of ``fit_args``: the overrides make it ``tiny-rmsnorm-<hash>``."""


def fit_args(runs_dir: Path, steps: int, *extra: str) -> list[str]:
    return [
        "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--runs_dir", str(runs_dir),
        "--trainer.max_steps", str(steps), "--checkpoint.every_n_train_steps", "5",
        "--trainer.limit_val_batches", "0", "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2",
        "--data.init_args.shuffle_buffer", "0", "--model.overrides", TINY, *extra,
    ]  # fmt: skip


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-step run saving every 5 steps (module-scoped: tests copy it before changing it)."""
    runs = tmp_path_factory.mktemp("trained") / "runs"
    cli = main(fit_args(runs, 12, "--trainer.enable_progress_bar", "false"))
    assert cli.trainer.global_step == 12
    return runs


def copy_runs(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "runs"))


def test_the_final_step_is_saved_in_last_ckpt(trained: Path) -> None:
    """Lightning alone leaves last.ckpt at step 10 of a 12-step run that saves every 5 steps."""
    version = trained / RUN / "version_0"
    assert saved_step(version / "checkpoints" / "last.ckpt") == 12
    # one file: Lightning's top-1 also kept a full, soon stale epoch=0-step=10.ckpt beside it
    assert [p.name for p in (version / "checkpoints").iterdir()] == ["last.ckpt"]
    assert (version / "config.yaml").exists() and list(version.glob("events.out.tfevents.*"))
    hparams = yaml.safe_load((version / "hparams.yaml").read_text())
    assert hparams["norm"] == "rmsnorm" and hparams["norm_args"] == {}


@pytest.mark.slow
def test_resume_continues_its_version_and_a_new_run_takes_the_next(trained: Path, tmp_path: Path, caplog) -> None:
    runs = copy_runs(trained, tmp_path)
    run = runs / RUN
    version = run / "version_0"
    with caplog.at_level("INFO"):
        cli = main(fit_args(runs, 14, "--ckpt_path", "last"))  # max_steps may change on resume
    # where logs and checkpoints go, at the start and the end
    assert f"logs in {version}, checkpoints in {version / 'checkpoints'}" in caplog.text
    assert f"finished at step 14; last checkpoint {version / 'checkpoints' / 'last.ckpt'}" in caplog.text
    bar = cli.trainer.progress_bar_callback.train_progress_bar
    assert (bar.n, bar.total) == (14, 14)  # steps out of max_steps, not batches of the epoch
    # the rate is this run's 2 steps over its time: it counted the 12 resumed steps as done in no time
    assert bar.initial == 12 and bar.format_dict["n"] - bar.format_dict["initial"] == 2
    assert cli.trainer.global_step == 14 and cli.trainer.logger.log_dir == str(run / "version_0")
    assert saved_step(run / "version_0" / "checkpoints" / "last.ckpt") == 14
    assert len(list((run / "version_0").glob("events.out.tfevents.*"))) == 2  # one folder, one curve
    assert not (run / "version_1").exists()
    assert [p.name for p in (run / "version_0" / "checkpoints").glob("last*")] == ["last.ckpt"]
    cli = main(fit_args(runs, 3, "--trainer.enable_progress_bar", "false"))  # a new run of the same name
    assert cli.trainer.logger.log_dir == str(run / "version_1")
    assert saved_step(run / "version_1" / "checkpoints" / "last.ckpt") == 3
    assert saved_step(run / "version_0" / "checkpoints" / "last.ckpt") == 14  # untouched
    # `last` is now the newest version's: resuming it continues version_1
    cli = main(fit_args(runs, 4, "--ckpt_path", "last", "--trainer.enable_progress_bar", "false"))
    assert cli.trainer.global_step == 4 and cli.trainer.logger.log_dir == str(run / "version_1")


def test_periodic_copies_are_kept_when_asked_for(tmp_path: Path) -> None:
    main(fit_args(tmp_path, 10, "--checkpoint.save_top_k", "-1", "--trainer.enable_progress_bar", "false"))
    folder = tmp_path / RUN / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt", "last.ckpt"]


def test_the_default_run_name_differs_whenever_the_model_does(tmp_path: Path) -> None:
    """A QK-norm run had the plain scheme's name (``tiny-derf``), so the plain run's ``--ckpt_path last``
    picked up the QK checkpoint."""
    assert default_run_name("tiny", "derf") == "tiny-derf"
    qk = default_run_name("tiny", "derf", {"qk_norm": True})
    assert re.fullmatch(r"tiny-derf-[0-9a-f]{8}", qk)
    assert default_run_name("tiny", "derf", {"qk_norm": True, "n_layers": 2}) not in (qk, "tiny-derf")
    # spelled-out defaults, a run fact, and an empty mapping name the same model
    assert default_run_name("tiny", "derf", {"qk_norm": False}, {}) == "tiny-derf"
    overlay = yaml.safe_load((ROOT / "recipes" / "norms" / "bhyt.yaml").read_text())["model"]["norm_args"]
    assert default_run_name("tiny", "bhyt", {}, {**overlay, "seq_len": 16}) == "tiny-bhyt"
    assert default_run_name("tiny", "bhyt", {}, {**overlay, "p": 0.9}) != "tiny-bhyt"
    base = ["--config", str(ROOT / "recipes" / "tiny.yaml"), "--config", str(ROOT / "recipes" / "norms" / "derf.yaml"),
            "--runs_dir", str(tmp_path)]  # fmt: skip
    qk_run = main([*base, "--config", str(ROOT / "recipes" / "norms" / "qk_norm.yaml")], run=False)
    assert Path(qk_run.trainer.logger.log_dir).parent == tmp_path / qk
    assert Path(main(base, run=False).trainer.logger.log_dir).parent == tmp_path / "tiny-derf"


def test_a_resumed_run_prints_its_paths_as_the_fresh_run_did(tmp_path: Path, monkeypatch, caplog) -> None:
    """With a relative --runs_dir the fresh run printed relative paths and the resumed one absolute paths."""
    monkeypatch.chdir(tmp_path)
    args = [a if a != str(tmp_path / "runs") else "runs" for a in fit_args(tmp_path / "runs", 2)]
    with caplog.at_level("INFO"):
        main([*args, "--trainer.enable_progress_bar", "false"])
        main([*args, "--trainer.max_steps", "3", "--ckpt_path", "last", "--trainer.enable_progress_bar",
              "false"])  # fmt: skip
    version = Path("runs") / RUN / "version_0"
    starts = [r.getMessage() for r in caplog.records if "bhyt_pl: logs in" in r.getMessage()]
    assert starts == [f"bhyt_pl: logs in {version}, checkpoints in {version / 'checkpoints'}"] * 2


def test_the_old_checkpoint_layout_is_still_found(trained: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    legacy = runs / RUN / "checkpoints"
    legacy.mkdir(parents=True)
    shutil.copy(trained / RUN / "version_0" / "checkpoints" / "last.ckpt", legacy / "last.ckpt")
    cli = main(fit_args(runs, 13, "--ckpt_path", "last", "--trainer.enable_progress_bar", "false"))
    assert cli.trainer.global_step == 13
    assert cli.trainer.logger.log_dir == str(runs / RUN / "version_0")  # a new version folder


def test_ckpt_path_last_with_nothing_to_resume_says_where_it_looked(trained: Path, tmp_path: Path) -> None:
    """It used to start from step 0 and exit 0 (here: the run is under tiny-rmsnorm, not tiny-layernorm)."""
    runs = copy_runs(trained, tmp_path)
    looked = r"nothing to resume under '.*tiny-layernorm-[0-9a-f]{8}' \(looked in .*checkpoints\)"
    with pytest.raises(UsageError, match=looked):
        main(fit_args(runs, 13, "--ckpt_path", "last", "--model.norm", "layernorm"))
    assert not list(runs.glob("tiny-layernorm*"))


@pytest.mark.parametrize(
    ("args", "fields", "explicit"),
    [
        (["--model.norm", "layernorm", "--run_name", RUN], ["model.norm: checkpoint 'rmsnorm'"], False),
        (["--model.norm_args", "{eps: 1.0e-6}"], ["model.norm_args.eps: checkpoint 1e-05, this run 1e-06"], True),
        (["--model.lr", "0.1", "--model.preset", "small", "--model.norm", "bhyt"],
         ["model.preset: checkpoint 'tiny', this run 'small'", "model.lr: checkpoint 0.003, this run 0.1",
          "model.norm: checkpoint 'rmsnorm', this run 'bhyt'"],
         True),
        (["--data.init_args.seq_len", "32"], ["model.seq_len: checkpoint 16, this run 32"], False),
    ],
    ids=["norm-last", "norm_args-file", "preset-lr-norm-file", "seq_len-last"],
)  # fmt: skip
def test_resume_with_another_config_fails_before_any_work(
    trained: Path, tmp_path: Path, args: list[str], fields: list[str], explicit: bool
) -> None:
    """With ``last`` the layernorm run trained on RMSNorm weights; with a file Lightning silently took the
    checkpoint's norm, preset and lr instead of the command line's."""
    runs = copy_runs(trained, tmp_path)
    ckpt = str(runs / RUN / "version_0" / "checkpoints" / "last.ckpt") if explicit else "last"
    before = sorted(p for p in runs.rglob("*"))
    with pytest.raises(UsageError, match="the configuration differs from the checkpoint") as err:
        main(fit_args(runs, 20, *args, "--ckpt_path", ckpt))
    for field in fields:
        assert field in str(err.value)
    assert "<unset>" not in str(err.value) and "norm_args" not in str(err.value).replace("model.norm_args.eps", "")
    assert sorted(p for p in runs.rglob("*")) == before  # nothing written


def test_a_resume_spelling_out_the_default_norm_args_is_accepted(trained: Path, tmp_path: Path) -> None:
    """A norm overlay listing its defaults was refused as ``'<unset>' vs <default>``."""
    runs = copy_runs(trained, tmp_path)
    cli = main(fit_args(runs, 13, "--model.norm_args", "{eps: 1.0e-5}", "--ckpt_path", "last",
                        "--trainer.enable_progress_bar", "false"))  # fmt: skip
    assert cli.trainer.global_step == 13


OLD_RECIPE = ("--model.weight_decay", "0.1", "--model.warmup_ratio", "0.05")
"""What the base recipes set before they left weight decay and warmup to the norm scheme, and the flags
docs/how-to/resume.md gives for resuming such a run when the resume check refuses it."""


def test_runs_trained_with_the_old_recipe_values_still_resume(tmp_path: Path) -> None:
    """The base recipes no longer set weight_decay 0.1 and warmup_ratio 0.05. A run of a scheme without training
    defaults recorded exactly LlamaLM's defaults and resumes as it is; an nGPT run trained with them is refused
    (its scheme's defaults now apply), naming the settings, and resumes with the flags docs/how-to/resume.md gives."""
    quiet = ("--trainer.enable_progress_bar", "false")
    for norm in ("rmsnorm", "dyt"):
        runs = tmp_path / norm
        main(fit_args(runs, 3, "--model.norm", norm, *OLD_RECIPE, *quiet))
        cli = main(fit_args(runs, 4, "--model.norm", norm, "--ckpt_path", "last", *quiet))
        assert cli.trainer.global_step == 4
    runs = tmp_path / "ngpt"
    main(fit_args(runs, 3, "--model.norm", "ngpt", *OLD_RECIPE, *quiet))
    with pytest.raises(UsageError) as err:
        main(fit_args(runs, 4, "--model.norm", "ngpt", "--ckpt_path", "last", *quiet))
    assert "model.weight_decay: checkpoint 0.1, this run 0.0" in str(err.value)
    assert "model.warmup_steps: checkpoint None, this run 0" in str(err.value)
    cli = main(fit_args(runs, 4, "--model.norm", "ngpt", "--ckpt_path", "last", *OLD_RECIPE, *quiet))
    assert cli.trainer.global_step == 4 and cli.model.hparams.weight_decay == 0.1


def test_fine_tuning_with_init_checkpoint_may_change_norm_args(trained: Path, tmp_path: Path) -> None:
    ckpt = trained / RUN / "version_0" / "checkpoints" / "last.ckpt"
    args = fit_args(tmp_path, 2, "--model.init_checkpoint", str(ckpt), "--model.norm_args", "{eps: 1.0e-6}")
    cli = main(args[1:], run=False)  # a new run from the weights: no resume check applies
    assert cli.model.config.norm == "rmsnorm"


sys.path.insert(0, str(ROOT / "tests" / "distributed_jobs"))  # test callbacks a command line can name
from signals import SignalAt  # noqa: E402


def test_ctrl_c_finishes_the_step_saves_last_at_once_and_exits_130(tmp_path: Path, monkeypatch, capsys, caplog) -> None:
    """It ran a full validation pass before saving, printed "stopped by Ctrl-C" and "finished", and exited 0;
    before that it raised KeyboardInterrupt wherever it landed and kept only the previous periodic save."""
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under nohup
    validations = _Validations()
    cli = main(fit_args(tmp_path, 12, "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "1",
                        "--trainer.num_sanity_val_steps", "0")[1:], run=False)  # fmt: skip
    cli.trainer.callbacks[:0] = [SignalAt(7), validations]
    with caplog.at_level("INFO"), pytest.raises(StoppedByCtrlC):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = tmp_path / RUN / "version_0" / "checkpoints" / "last.ckpt"
    assert cli.trainer.global_step == 7 and saved_step(last) == 7
    assert validations.passes == []  # saved at once: no validation pass first
    lines = [
        r.getMessage() for r in caplog.records if "bhyt_pl: " in r.getMessage() and "logs in" not in r.getMessage()
    ]
    assert lines == [f"bhyt_pl: stopped by Ctrl-C at step 7; saved {last}; resume with --ckpt_path last"]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back
    # on the command line: exit status 130 (128 + SIGINT), no traceback
    monkeypatch.setattr(sys, "argv", ["bhyt_pl", *fit_args(tmp_path / "cli", 12, "--trainer.enable_progress_bar",
                                                           "false", "--trainer.callbacks+", "signals.SignalAt",
                                                           "--trainer.callbacks.step", "3")])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 130 and "Traceback" not in capsys.readouterr().err
    assert saved_step(tmp_path / "cli" / RUN / "version_0" / "checkpoints" / "last.ckpt") == 3


def _fake_slurm_job(tmp_path: Path, monkeypatch, scontrol: str) -> None:
    """A one-task SLURM job 4242 in ``tmp_path``, with a fake ``scontrol`` on PATH running the shell line given."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text(f"#!/bin/sh\n{scontrol}\n")
    (fake_bin / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    slurm = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}  # fmt: skip
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)


def test_slurm_requeue_signal_saves_last_requeues_and_the_requeued_job_resumes(tmp_path: Path, monkeypatch) -> None:
    """Lightning's handler saved ``hpc_ckpt_1.ckpt`` into the working directory wherever SIGUSR1 landed and
    kept training; ``scontrol`` is a fake on PATH that records its arguments."""
    calls = tmp_path / "scontrol.log"
    _fake_slurm_job(tmp_path, monkeypatch, f'echo "$@" >> {calls}')
    runs = tmp_path / "runs"
    args = fit_args(runs, 6, "--trainer.enable_progress_bar", "false")
    cli = main(args[1:], run=False)
    cli.trainer.callbacks.insert(0, SignalAt(3, signal.SIGUSR1))
    with pytest.raises(SystemExit) as exit_:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert exit_.value.code == 0 and cli.trainer.global_step == 3
    last = runs / RUN / "version_0" / "checkpoints" / "last.ckpt"
    assert saved_step(last) == 3 and calls.read_text().split() == ["requeue", "4242"]
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job repeats its command
    cli = main(args)
    assert cli.trainer.global_step == 6 and saved_step(last) == 6
    assert cli.trainer.logger.log_dir == str(runs / RUN / "version_0")


def test_a_failed_slurm_requeue_saves_last_and_exits_non_zero(tmp_path: Path, monkeypatch, caplog) -> None:
    """Exit 0 tells SLURM the job ended well; when ``scontrol requeue`` fails nothing will resume it, so the
    run exits 1 and says how to resume by hand."""
    _fake_slurm_job(tmp_path, monkeypatch, "exit 3")
    runs = tmp_path / "runs"
    cli = main(fit_args(runs, 4, "--trainer.enable_progress_bar", "false")[1:], run=False)
    cli.trainer.callbacks.insert(0, SignalAt(2, signal.SIGUSR1))
    with caplog.at_level("INFO"), pytest.raises(SystemExit) as exit_:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert exit_.value.code == 1 and cli.trainer.global_step == 2
    assert saved_step(runs / RUN / "version_0" / "checkpoints" / "last.ckpt") == 2
    assert "`scontrol requeue 4242` failed (3); resume with --ckpt_path last" in caplog.text


def test_resuming_a_finished_run_says_it_is_complete(trained: Path, tmp_path: Path, capsys) -> None:
    """It trained nothing and said nothing."""
    runs = copy_runs(trained, tmp_path)
    before = sorted(p for p in runs.rglob("*"))
    main(fit_args(runs, 12, "--ckpt_path", "last"))
    out = capsys.readouterr().out
    assert "bhyt_pl: the run is complete at step 12 (max_steps 12); nothing to train." in out
    assert "--trainer.max_steps" in out
    assert sorted(p for p in runs.rglob("*")) == before  # no new version, log or checkpoint


@pytest.mark.slow
def test_sigterm_saves_last_at_the_stopped_step_and_resume_continues(tmp_path: Path) -> None:
    """A real SIGTERM (a cluster's preemption) sent to a training subprocess: it used to lose every step
    since the last periodic save (here: all of them, saves every 1000 steps)."""
    from launch import clean_env

    marker = tmp_path / "reached"
    args = fit_args(tmp_path / "runs", 200, "--checkpoint.every_n_train_steps", "1000",
                    "--trainer.enable_progress_bar", "false", "--trainer.callbacks+", "signals.AnnounceAndSlow",
                    "--trainer.callbacks.marker", str(marker), "--trainer.callbacks.after_step", "3")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "bhyt_pl", *args], cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    last = tmp_path / "runs" / RUN / "version_0" / "checkpoints" / "last.ckpt"
    stopped = saved_step(last)
    assert 3 <= stopped < 200 and f"stopped by SIGTERM at step {stopped}" in out, out[-3000:]
    resume = fit_args(tmp_path / "runs", stopped + 2, "--ckpt_path", "last", "--trainer.enable_progress_bar", "false")
    cli = main(resume)
    assert cli.trainer.global_step == stopped + 2
    assert saved_step(last) == stopped + 2
    assert os.path.samefile(cli.trainer.logger.log_dir, last.parent.parent)


class _Validations(L.Callback):
    """Records the batches of every validation pass (the sanity check too) and ``val/loss`` per step;
    optionally sends this process a SIGTERM after a step, as a cluster's preemption does."""

    def __init__(self, sigterm_at: int | None = None) -> None:
        self.sigterm_at = sigterm_at
        self.passes: list[list[str]] = []
        self.val_loss: dict[int, float] = {}

    def on_validation_start(self, trainer: L.Trainer, *args) -> None:
        self.passes.append([])

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module, batch, *args) -> None:
        self.passes[-1].append(hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest())

    def on_validation_end(self, trainer: L.Trainer, *args) -> None:
        if not trainer.sanity_checking:
            self.val_loss[trainer.global_step] = float(trainer.callback_metrics["val/loss"])

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_validation_reads_fixed_batches_and_a_resumed_run_has_the_same_val_loss(tmp_path: Path) -> None:
    """The validation loader continued where the previous pass stopped (sanity check: batches 0-1, then
    2-3, 4-5, ...), so ``val/loss`` mixed data changes with training and differed after a resume."""
    validate = ["--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "3",
                "--trainer.enable_progress_bar", "false"]  # fmt: skip

    def fit(runs: Path, recorder: _Validations, ckpt_path: Path | None = None) -> L.Trainer:
        cli = main(fit_args(runs, 12, *validate)[1:], run=False)
        cli.trainer.callbacks.insert(0, recorder)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
        return cli.trainer

    uninterrupted = _Validations()
    fit(tmp_path / "a", uninterrupted)
    assert len(uninterrupted.passes) == 5 and sorted(uninterrupted.val_loss) == [3, 6, 9, 12]  # sanity check + 4
    assert all(p == uninterrupted.passes[0] and len(p) == 2 for p in uninterrupted.passes)
    interrupted = _Validations(sigterm_at=5)
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException: the process exits 0
        fit(tmp_path / "b", interrupted)
    last = tmp_path / "b" / RUN / "version_0" / "checkpoints" / "last.ckpt"
    assert saved_step(last) == 5
    resumed = _Validations()
    assert fit(tmp_path / "b", resumed, ckpt_path=last).global_step == 12
    assert all(p == uninterrupted.passes[0] for p in interrupted.passes + resumed.passes)
    assert interrupted.val_loss == {3: uninterrupted.val_loss[3]}
    assert resumed.val_loss == {k: uninterrupted.val_loss[k] for k in (6, 9, 12)}

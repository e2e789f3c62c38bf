"""A full disk during a save is named as such (``bhyt_pl.disk_full``): from the errno where torch keeps it, and
from the free space left when the save failed where torch's zip writer hides it behind ``unexpected pos``.
The command-line line (exit status 2, printed once, also under FSDP2 on two processes) is checked here too."""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from bhyt_pl.checkpoint_io import AtomicCheckpointIO, checkpoint_step, human_size
from bhyt_pl.disk_full import DiskFull, disk_full_in, payload_bytes, save_disk_full

UNEXPECTED_POS = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
"""What torch 2.13's zip writer raised when a 60 MB tmpfs filled up during a save (no errno in its chain)."""
MIB = 2**20
RECIPES = Path(__file__).resolve().parents[1] / "recipes"
_usage = namedtuple("usage", "total used free")


def _free_space(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _usage(10 * free + 10**9, 0, free))


def test_the_errno_in_the_chain_names_a_full_disk_or_a_quota(tmp_path: Path, monkeypatch) -> None:
    writer = RuntimeError(UNEXPECTED_POS)
    writer.__context__ = OSError(errno.ENOSPC, "No space left on device")
    _free_space(monkeypatch, 1234)
    full = save_disk_full(writer, tmp_path / "last.ckpt", tmp_path / ".last.ckpt.x.tmp", needed=5000)
    assert (full.errno, full.filename, full.needed, full.free, full.__cause__) == (
        errno.ENOSPC, str(tmp_path / "last.ckpt"), 5000, 1234, writer)  # fmt: skip
    assert str(full) == f"[Errno 28] No space left on device: '{tmp_path / 'last.ckpt'}'"
    quota = save_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path / "x", tmp_path, needed=1)
    assert quota.strerror == "Disk quota exceeded"
    assert disk_full_in(RuntimeError("a bug")) is None


def test_without_an_errno_the_free_space_at_failure_decides(tmp_path: Path, monkeypatch) -> None:
    """The rule: full when the free space is below what remained to write (``needed`` minus the bytes of the
    partial output) plus 1 MiB and 1 % of ``needed``."""
    partial = tmp_path / ".last.ckpt.abcdefgh.tmp"
    partial.write_bytes(b"x" * 3000)
    needed = 100 * MIB
    boundary = needed - 3000 + MIB + needed // 100  # remaining + slack, by hand
    err = RuntimeError(UNEXPECTED_POS)
    _free_space(monkeypatch, boundary - 1)
    full = save_disk_full(err, tmp_path / "last.ckpt", partial, needed)
    assert isinstance(full, DiskFull) and full.errno == errno.ENOSPC and full.needed == needed
    _free_space(monkeypatch, boundary)  # room enough: something else broke the save
    assert save_disk_full(err, tmp_path / "last.ckpt", partial, needed) is None
    folder = tmp_path / ".last.ckpt.step3.tmp"  # a sharded save: every file of the folder counts as written
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"x" * 1000)
    (folder / "__1_0.distcp").write_bytes(b"x" * 2000)
    _free_space(monkeypatch, boundary - 1)
    assert save_disk_full(err, tmp_path / "last.ckpt", folder, needed) is not None


def test_a_disk_full_error_survives_pickling_and_counts_the_payload() -> None:
    full = pickle.loads(pickle.dumps(DiskFull(errno.ENOSPC, "/ckpt/last.ckpt", 123, 45)))
    assert (full.errno, full.filename, full.needed, full.free) == (errno.ENOSPC, "/ckpt/last.ckpt", 123, 45)
    checkpoint = {"state_dict": {"w": torch.zeros(10, 3), "b": torch.zeros(5, dtype=torch.float16)},
                  "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(7, dtype=torch.float64)}}}],
                  "global_step": 4}  # fmt: skip
    assert payload_bytes(checkpoint) == 30 * 4 + 5 * 2 + 7 * 8


@pytest.mark.parametrize("how", ["errno", "unexpected_pos"])
def test_the_atomic_writer_raises_disk_full_and_keeps_the_previous_file(tmp_path: Path, monkeypatch, how) -> None:
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 2}, target)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 part of a zip")
        _free_space(monkeypatch, 100)  # the file system filled up with this write
        if how == "errno":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError(UNEXPECTED_POS)

    monkeypatch.setattr(torch, "save", full_disk)
    checkpoint = {"global_step": 3, "w": torch.zeros(1000)}
    with pytest.raises(DiskFull) as err:
        AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    monkeypatch.setattr(torch, "save", real_save)
    assert (err.value.filename, err.value.needed, err.value.free) == (str(target), 4000, 100)
    assert checkpoint_step(target) == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.parametrize("how", ["errno", "unexpected_pos"])
def test_a_full_disk_at_a_save_is_one_line_printed_once_with_exit_status_2(tmp_path: Path, monkeypatch, capsys,
                                                                           how) -> None:  # fmt: skip
    """It read ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`` and
    exited with status 1, without ``No space left on device``."""
    from bhyt_pl.cli import main

    real_save = torch.save
    saves = []

    def fills_up_at_the_second_save(obj, f, *args, **kwargs):
        if not hasattr(f, "write") or not isinstance(obj, dict) or "global_step" not in obj:
            return real_save(obj, f, *args, **kwargs)  # not a checkpoint
        saves.append(obj["global_step"])
        if len(saves) < 2:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04 part of a zip")
        _free_space(monkeypatch, 100 * 1000)  # the disk filled up during this save: 100 KB left
        if how == "errno":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError(UNEXPECTED_POS)

    _free_space(monkeypatch, 10**12)
    monkeypatch.setattr(torch, "save", fills_up_at_the_second_save)
    runs = tmp_path / "runs"
    monkeypatch.setattr(sys, "argv", ["bhyt_pl", "fit", "--config", str(RECIPES / "tiny.yaml"), "--runs_dir",
                                      str(runs), "--run_name", "r", "--trainer.max_steps", "3",
                                      "--trainer.limit_val_batches", "0", "--data.init_args.seq_len", "16",
                                      "--data.init_args.batch_size", "2", "--model.overrides", "{n_layers: 1, dim: 32}",
                                      "--checkpoint.every_n_train_steps", "1", "--trainer.enable_progress_bar",
                                      "false"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main()
    monkeypatch.setattr(torch, "save", real_save)
    last = runs / "r" / "version_0" / "checkpoints" / "last.ckpt"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    from bhyt_pl.callbacks.checkpointing import checkpoint_bytes
    from bhyt_pl.module import LlamaLM

    lm = LlamaLM(preset="tiny", seq_len=16, overrides={"n_layers": 1, "dim": 32})
    lm.configure_model()
    expected = (
        f"error: No space left on device while saving {last} at step 2 (100.0 KB was free when the save failed; "
        f"a checkpoint needs about {human_size(checkpoint_bytes(lm))}). Free space, or write the run elsewhere with "
        f"--runs_dir; the previous checkpoint {last} (step 1) is intact"
    )
    assert exit_.value.code == 2 and lines[-1] == expected, err[-3000:]
    assert err.count("No space left on device") == 1 and "Traceback" not in err, err[-3000:]
    assert checkpoint_step(last) == 1
    log = (runs / "r" / "version_0" / "train.log").read_text()
    assert log.rstrip().endswith(expected)  # and the traceback above it keeps the writer's error
    assert (UNEXPECTED_POS if how == "unexpected_pos" else "OSError: [Errno 28] No space left on device") in log


@pytest.mark.slow
@pytest.mark.distributed
def test_a_full_disk_at_a_sharded_save_is_one_line_on_two_processes(tmp_path: Path) -> None:
    """FSDP2 on two processes: Lightning's ``meta.pt`` (torch's zip writer given a path, no errno) fails on rank 0
    with the free space gone. Each rank printed its own line, with ``unexpected pos`` and status 1."""
    import subprocess

    from distributed_jobs.launch import ROOT, clean_env, write_yaml

    job = {"trainer": {"max_steps": 3, "limit_val_batches": 0, "enable_progress_bar": False,
                       "enable_model_summary": False,
                       "callbacks+": [{"class_path": "kill_points.KillAt",
                                       "init_args": {"point": "rank0_meta_pt_disk_full", "step": 2}}]},
           "model": {"overrides": {"dim": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 48}},
           "checkpoint": {"every_n_train_steps": 1},
           "data": {"init_args": {"seq_len": 16, "batch_size": 2}}}  # fmt: skip
    argv = ["--config", str(ROOT / "recipes" / "tiny.yaml"), "--config", str(ROOT / "recipes" / "distributed" /
            "fsdp2-cpu.yaml"), "--config", write_yaml(tmp_path / "job.yaml", job), "--runs_dir", str(tmp_path / "runs"),
            "--run_name", "r"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "bhyt_pl", "fit", *argv], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    last = tmp_path / "runs" / "r" / "version_0" / "checkpoints" / "last.ckpt"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines[-1].startswith(
        f"error: No space left on device while saving {last} at step 2 (100.0 KB was free when the save failed; a "
        f"checkpoint needs about "
    ), proc.stderr[-3000:]
    assert lines[-1].endswith(f"). Free space, or write the run elsewhere with --runs_dir; the previous checkpoint "
                              f"{last} (step 1) is intact")  # fmt: skip
    assert proc.stderr.count("No space left on device") == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert checkpoint_step(last) == 1 and os.listdir(last.parent) == ["last.ckpt"]

"""Distributed training on CPU (gloo): DDP and FSDP2 against one process, validation included, sharded
checkpoints, exact resume after SIGKILL, evaluation (validate, test, predict) on two ranks against one process,
and the documented two-process rehearsal (docs/how-to/distributed.md). Every multi-process job runs as a
subprocess with a clean environment."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from distributed_jobs.launch import ROOT, records, run, val_records, write_yaml

from bhyt_pl import Llama, LlamaConfig, load_model, registered_norms
from bhyt_pl.checkpoint_io import AtomicCheckpointIO, consolidate_checkpoint
from bhyt_pl.data import EMBEDDED_DATA_FILES

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SMALL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 48, "max_seq_len": 64}
FSDP2 = {
    "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
    "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1},
}
LOSS_TOL = 2e-5  # fp32 on CPU: two ranks sum gradients in another order than one process
VAL_EVERY = 3  # validation every 3 steps and at the last one


def _fit(
    tmp: Path,
    name: str,
    *,
    devices: int = 1,
    strategy=None,
    data: dict | None = None,
    steps: int = 6,
    norm: str = "bhyt",
    kill_at: int | None = None,
    resume: bool = False,
    probe: bool = False,
    init: Path | None = None,
    val_batches: int = 2,
    extra: list[str] = (),
) -> Path:
    out = tmp / "records" / name
    cfg = {
        "trainer": {
            "devices": devices,
            "max_steps": steps,
            "limit_val_batches": val_batches,  # batches of the whole validation set, split evenly across the ranks
            "val_check_interval": VAL_EVERY,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks+": [
                {
                    "class_path": "recorder.StepRecorder",
                    "init_args": {"out_dir": str(out), "kill_at_step": kill_at, "probe_logits": probe},
                }
            ],
        },
        "model": {
            "norm": norm,
            "overrides": SMALL,
            "warmup_steps": 2,
            "init_checkpoint": str(init) if init is not None else None,
        },
        "checkpoint": {"every_n_train_steps": 1},
    }
    if strategy is not None:
        cfg["trainer"]["strategy"] = strategy
    if data is not None:
        cfg["data"] = data
    job = write_yaml(tmp / f"{name}.yaml", cfg)
    argv = [
        "-m",
        "bhyt_pl",
        "fit",
        "--config",
        str(ROOT / "recipes/tiny.yaml"),
        "--config",
        job,
        "--runs_dir",
        str(tmp / "runs"),
        "--run_name",
        name.split("+")[0],
        *extra,
    ]
    if resume:
        argv += ["--ckpt_path", "last"]
    proc = run(argv, check=kill_at is None)
    if kill_at is not None:
        assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) or "Killed" in proc.stderr, proc.stderr[
            -3000:
        ]
    return out


def _token_data(batch_size: int) -> dict:
    return {
        "class_path": "lm_fixtures.TokenDataModule",
        "init_args": {"seq_len": 32, "batch_size": batch_size, "vocab": 64, "n": 256},
    }


def _losses(out: Path, rank: int = 0) -> list[float]:
    return [r["loss"] for r in records(out)[rank]]


@pytest.fixture(scope="module")
def initial_weights(tmp_path_factory) -> Path:
    """One set of initial weights for every run compared below (FSDP2 initialises its shards itself,
    with a different random stream than one process, so runs start from this checkpoint instead)."""
    torch.manual_seed(0)
    config = LlamaConfig.from_name("tiny", **SMALL, norm="bhyt", norm_args={"seq_len": 32})
    model = Llama(config)
    path = tmp_path_factory.mktemp("init") / "init.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "bhyt_pl": {"model_config": config.to_dict(), "tokenizer": "embedded"},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def one_process_reference(tmp_path_factory, initial_weights) -> Path:
    """1 process, global batch 8, validation on the 16 windows of 2 batches: the run DDP and FSDP2 must reproduce."""
    tmp = tmp_path_factory.mktemp("ref")
    return _fit(tmp, "ref", data=_token_data(8), init=initial_weights)


def _check_validation(out: Path, steps: list[int], reference: Path | None = None, tol: float = LOSS_TOL) -> None:
    """``val/loss`` logged after ``steps``, the same on every rank, and (``reference``) equal to that run's."""
    val = val_records(out)
    assert val and all([r["step"] for r in rank] == steps for rank in val.values()), val
    for rank in val.values():
        assert [r["val_loss"] for r in rank] == [r["val_loss"] for r in val[0]]  # the synced token mean
    if reference is not None:
        expected = [r["val_loss"] for r in val_records(reference)[0]]
        assert max(abs(r["val_loss"] - e) for r, e in zip(val[0], expected, strict=True)) <= tol


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_processes_match_one_process_with_the_same_global_batch(
    strategy, one_process_reference, initial_weights, tmp_path
):
    out = _fit(
        tmp_path,
        strategy,
        devices=2,
        strategy="ddp" if strategy == "ddp" else FSDP2,
        data=_token_data(4),
        probe=strategy == "fsdp2",
        init=initial_weights,
        val_batches=4,  # 4 x 4 windows: the reference's 16 (2 x 8), 8 on each rank
        extra=["--trainer.use_distributed_sampler", "false"],
    )
    recs = records(out)
    reference = _losses(one_process_reference)
    # the logged loss is each rank's mean over its half; the global loss is their mean (equal token counts)
    global_losses = [(a["loss"] + b["loss"]) / 2 for a, b in zip(recs[0], recs[1])]
    assert len(global_losses) == len(reference) == 6
    assert max(abs(a - b) for a, b in zip(global_losses, reference)) < LOSS_TOL
    for a, b in zip(recs[0], recs[1]):  # different data on each rank, same step and LR
        assert not set(a["rows"]) & set(b["rows"])
        assert a["lr"] == b["lr"] and a["step"] == b["step"]
    _check_validation(out, [3, 6], reference=one_process_reference)
    if strategy == "fsdp2":
        _check_sharded_checkpoint(tmp_path, out)


def _check_sharded_checkpoint(tmp: Path, out: Path) -> None:
    """The FSDP2 run's sharded last checkpoint consolidates into one file whose model, loaded in one
    process, gives the sharded model's logits; and the sharded checkpoint resumes training."""
    folder = tmp / "runs" / "fsdp2" / "version_0" / "checkpoints" / "last.ckpt"
    assert folder.is_dir() and (folder / ".metadata").exists()
    single = consolidate_checkpoint(folder, tmp / "consolidated.ckpt")
    probe = torch.load(out / "probe.pt")
    loaded = load_model(single)
    assert loaded.config.norm == "bhyt"
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(probe["idx"]), probe["logits"], atol=1e-5, rtol=1e-5)
    # the CLI subcommand does the same
    run(["-m", "bhyt_pl", "consolidate", str(folder), str(tmp / "cli.ckpt")])
    assert torch.load(tmp / "cli.ckpt", weights_only=False)["global_step"] == 6
    # resume the sharded checkpoint for two more steps
    resumed = _fit(
        tmp,
        "fsdp2+resume",
        devices=2,
        strategy=FSDP2,
        data=_token_data(4),
        steps=8,
        resume=True,
        extra=["--trainer.use_distributed_sampler", "false"],
    )
    assert [r["step"] for r in records(resumed)[0]] == [7, 8]
    _check_validation(resumed, [8])  # the last step's pass


def test_every_norm_scheme_trains_under_fsdp2(tmp_path) -> None:
    """One torchrun job: each scheme, sharded over 2 ranks, matches one process (loss and BHyT's c); nGPT's
    post-step normalisation reduces column norms across the ranks (every gathered matrix has unit norm)."""
    job = ROOT / "tests" / "distributed_jobs" / "fsdp2_schemes.py"
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(job), str(tmp_path)])
    results = torch.load(tmp_path / "fsdp2_schemes.pt")
    assert set(results) == {*registered_norms(), "mix_ln+qk_norm", "reordered+qk_full", "hybridnorm+star"}
    for norm, r in results.items():
        torch.testing.assert_close(r["sharded_losses"], r["single_losses"], atol=1e-5, rtol=1e-5, msg=norm)
        for rank_c in r["sharded_c"]:
            torch.testing.assert_close(rank_c, r["single_c"], atol=1e-9, rtol=1e-6, msg=norm)
    assert results["ngpt"]["unit_norm_error"] and max(results["ngpt"]["unit_norm_error"]) < 1e-5


def test_chunked_loss_inside_forward_under_fsdp2(tmp_path) -> None:
    """Llama.forward(idx, labels=...) sharded over 2 ranks: losses and gathered gradients equal the plain
    loss of full logits in one process (the tied embedding is read inside the root's forward)."""
    job = ROOT / "tests" / "distributed_jobs" / "fsdp2_chunked_loss.py"
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(job), str(tmp_path)])
    r = torch.load(tmp_path / "fsdp2_chunked_loss.pt")
    torch.testing.assert_close(r["sharded_losses"], r["single_losses"], atol=1e-6, rtol=1e-6)
    assert set(r["sharded_grads"]) == set(r["single_grads"])
    for name, grad in r["single_grads"].items():
        torch.testing.assert_close(r["sharded_grads"][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_sigkill_then_resume_from_last_is_identical_in_one_process(tmp_path) -> None:
    extra = ["--data.init_args.seq_len", "32", "--data.init_args.batch_size", "4"]
    full = records(_fit(tmp_path, "full", steps=8, extra=extra))[0]  # the recipe's embedded C4
    _fit(tmp_path, "cut", steps=8, kill_at=4, extra=extra)
    cut_dir = tmp_path / "records" / "cut"
    before = records(cut_dir)[0]
    assert [r["step"] for r in before] == [1, 2, 3, 4]
    _fit(tmp_path, "cut", steps=8, resume=True, extra=extra)  # same run name: finds cut's last.ckpt
    after = records(cut_dir)[0][4:]
    assert [r["step"] for r in after] == [5, 6, 7, 8]
    for a, b in zip(before + after, full):
        assert a["rows"] == b["rows"]  # the same windows in the same order
        assert a["lr"] == b["lr"]
        assert a["loss"] == b["loss"]  # bit-identical on CPU in one process
    _check_validation(cut_dir, [3, 6, 8], reference=tmp_path / "records" / "full", tol=0.0)  # 3 before the kill
    _check_validation(tmp_path / "records" / "full", [3, 6, 8])


def test_sigkill_then_resume_under_ddp(tmp_path) -> None:
    extra = ["--data.init_args.seq_len", "32", "--data.init_args.batch_size", "4"]
    full = records(_fit(tmp_path, "ddpfull", devices=2, strategy="ddp", steps=6, extra=extra))
    assert not set(full[0][0]["rows"]) & set(full[1][0]["rows"])  # ranks read different files
    _fit(tmp_path, "ddpcut", devices=2, strategy="ddp", steps=6, kill_at=3, extra=extra)
    _fit(tmp_path, "ddpcut", devices=2, strategy="ddp", steps=6, resume=True, extra=extra)
    cut = records(tmp_path / "records" / "ddpcut")
    for rank in (0, 1):
        assert [r["step"] for r in cut[rank]] == [1, 2, 3, 4, 5, 6]
        for a, b in zip(cut[rank], full[rank]):
            assert a["rows"] == b["rows"] and a["lr"] == b["lr"]
            assert abs(a["loss"] - b["loss"]) < LOSS_TOL
    _check_validation(tmp_path / "records" / "ddpfull", [3, 6])
    _check_validation(tmp_path / "records" / "ddpcut", [3, 6], reference=tmp_path / "records" / "ddpfull")


def test_evaluation_on_two_ranks_reads_and_scores_what_one_process_does(initial_weights, tmp_path) -> None:
    """``validate``, ``test`` and ``predict`` of C4 and LIMA under DDP and FSDP2 on 2 ranks. Each rank read the
    batches of its own files or its padded sampler's share: FSDP2's forward hung when one rank had a batch less.
    Now the ranks read equally many batches, item i on rank i mod 2, together the first items one process reads
    under the same limits; ``val/loss``, ``test/loss`` and each sequence's NLL equal one process's."""
    from distributed_jobs.eval_shares import LIMITS, evaluate

    job = ROOT / "tests" / "distributed_jobs" / "eval_shares.py"
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(job), str(tmp_path),
         str(initial_weights)])  # fmt: skip
    ranks = [torch.load(tmp_path / f"eval_shares_rank{rank}.pt") for rank in (0, 1)]
    for data, limit in LIMITS.items():
        one = evaluate(data, str(initial_weights))
        for strategy in ("ddp", "fsdp2"):
            first, second = (ranks[rank][strategy, data] for rank in (0, 1))
            for stage, rows in one["rows"].items():
                assert len(rows) == limit * 2  # the limit counts batches of 2 of the whole set: half on each rank
                assert len(first["rows"][stage]) == len(second["rows"][stage]) == limit, (strategy, data, stage)
                assert [row for pair in zip(first["rows"][stage], second["rows"][stage]) for row in pair] == rows
            for key in ("val_loss", "test_loss"):
                assert first[key] == second[key] == pytest.approx(one[key], rel=1e-6), (strategy, data, key)
            assert first["nll"] == pytest.approx(one["nll"][0::2], rel=1e-6)
            assert second["nll"] == pytest.approx(one["nll"][1::2], rel=1e-6)
            assert first["own_sampler"] == second["own_sampler"] == (data == "lima")  # Lightning kept LIMA's sampler


@pytest.mark.parametrize(
    "launch",
    [["--config", "recipes/distributed/fsdp2-cpu.yaml"], ["--trainer.devices", "2", "--trainer.strategy", "ddp"]],
    ids=["fsdp2", "ddp"],
)
def test_the_readme_two_process_rehearsal_validates_and_finishes(launch: list[str], tmp_path) -> None:
    """The documented FSDP2-on-CPU rehearsal with validation every 2 steps (and DDP instead of FSDP2) hung in its
    first validation pass: one rank's validation file gave a batch less than the other's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(["-m", "bhyt_pl", "fit", "--config", "recipes/tiny.yaml", *launch, "--trainer.max_steps", "4",
         "--trainer.val_check_interval", "2", "--runs_dir", str(tmp_path)], timeout=300)  # fmt: skip
    events = EventAccumulator(str(tmp_path / "tiny-rmsnorm" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    # the passes after steps 2 and 4: the depth statistics log them at trainer.global_step, Lightning logs its own
    # metrics inside fit at the number of optimizer steps before the current one's (1 and 3)
    assert [event.step for event in events.Scalars("depth_val/magnitude/layer_00")] == [2, 4]
    assert [event.step for event in events.Scalars("val/loss")] == [1, 3]


def test_a_validation_split_too_small_for_the_ranks_is_one_error_line_before_training(tmp_path) -> None:
    """Every rank raises it in ``setup``; rank 0 alone prints it, and no step is taken."""
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copy(EMBEDDED_DATA_FILES["train"][0], shards)
    with gzip.open(shards / "c4-validation.00000-of-00001.json.gz", "wt") as f:
        f.write(json.dumps({"text": "In the beginning God created the heaven and the earth."}) + "\n")  # one window
    proc = run(["-m", "bhyt_pl", "fit", "--config", "recipes/tiny.yaml", "--trainer.devices", "2",
                "--trainer.strategy", "ddp", "--data.init_args.data_files", str(shards),
                "--data.init_args.seq_len", "8", "--runs_dir", str(tmp_path / "runs")], check=False)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and errors == [
        "error: C4 split 'validation' has 1 window of 9 tokens for 2 ranks; every rank needs at least one: give it "
        "more documents (--data.init_args.data_files), a shorter --data.init_args.seq_len or fewer devices, or no "
        "validation (--data.init_args.val_split null)"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not list((tmp_path / "runs").rglob("*.ckpt"))


def test_atomic_checkpoint_io_never_leaves_a_truncated_file(tmp_path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, target)

    def dies_mid_write(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # a kill arriving during the write

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert torch.load(target)["step"] == 1  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary left behind

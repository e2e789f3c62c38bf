"""NormConstantRefresh: c follows the weights (steps, resume, FSDP2), can be configured or disabled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, bhyt_trained_between_refreshes, quiet_trainer

from bhyt_pl.callbacks import NormConstantRefresh, default_refresh_interval, norm_refresh_callbacks
from bhyt_pl.checkpoint import NORM_CONSTANTS
from bhyt_pl.cli import main
from bhyt_pl.module import LlamaLM
from bhyt_pl.norms.bhyt import vo_constant

ROOT = Path(__file__).resolve().parents[2]
FSDP2_JOB = ROOT / "tests" / "distributed_jobs" / "fsdp2_norm_refresh.py"
LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "ROLE_RANK", "NODE_RANK")  # fmt: skip


def expected_c(lm: LlamaLM) -> list[float]:
    """``||W_V W_O||_F^2 / (T d)`` of every layer from the current weights (independent of the module's cache)."""
    out = []
    for layer in lm.model.layers:
        a = layer.attn
        out.append(float(vo_constant(a.v_proj.weight, a.o_proj.weight, a.n_head, a.n_kv_head, 32)))
    return out


def cached_c(lm: LlamaLM) -> list[float]:
    return [float(layer.norms.c) for layer in lm.model.layers]


def bhyt_lm(cls: type[LlamaLM] = LlamaLM) -> LlamaLM:
    return cls(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, lr=3e-2, warmup_steps=0)


class RecordC(L.Callback):
    def __init__(self) -> None:
        self.at_train_start: list[float] = []
        self.expected_at_train_start: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.at_train_start, self.expected_at_train_start = cached_c(pl_module), expected_c(pl_module)


def test_interval_formula() -> None:
    assert [default_refresh_interval(n) for n in (1, 49, 100, 5_000, 50_000, 10**7)] == [1, 1, 2, 100, 1000, 1000]


def test_periodic_refresh_follows_the_weights_and_disabled_does_not() -> None:
    lm = bhyt_lm()
    trainer = quiet_trainer(callbacks=[NormConstantRefresh(every_n_steps=1)], max_steps=3)
    trainer.fit(lm, datamodule=TokenDataModule())
    assert cached_c(lm) == pytest.approx(expected_c(lm), rel=1e-6)

    lm = bhyt_lm()
    lm.configure_model()
    initial = cached_c(lm)
    trainer = quiet_trainer(callbacks=[NormConstantRefresh(enabled=False)], max_steps=3)
    trainer.fit(lm, datamodule=TokenDataModule())
    refreshes = [cb for cb in trainer.callbacks if isinstance(cb, NormConstantRefresh)]
    assert len(refreshes) == 1 and refreshes[0].enabled is False and refreshes[0].refreshes == 0
    assert cached_c(lm) == pytest.approx(initial)  # stale: the weights moved, c did not
    assert cached_c(lm) != pytest.approx(expected_c(lm), rel=1e-3)


def test_user_refresh_is_kept_and_default_added_otherwise() -> None:
    assert norm_refresh_callbacks(None, needs_refresh=False) == []
    trainer = quiet_trainer(callbacks=[NormConstantRefresh(every_n_steps=7)], max_steps=1)
    lm = bhyt_lm()
    trainer.fit(lm, datamodule=TokenDataModule())
    refreshes = [cb for cb in trainer.callbacks if isinstance(cb, NormConstantRefresh)]
    assert [cb.every_n_steps for cb in refreshes] == [7]
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(bhyt_lm(), datamodule=TokenDataModule())
    assert [type(cb) for cb in trainer.callbacks if isinstance(cb, NormConstantRefresh)] == [NormConstantRefresh]


def test_llamalm_keeps_a_user_configured_refresh() -> None:
    trainer = quiet_trainer(callbacks=[NormConstantRefresh(every_n_steps=7)], max_steps=1)
    trainer.fit(bhyt_lm(), datamodule=TokenDataModule())
    assert [cb.every_n_steps for cb in trainer.callbacks if isinstance(cb, NormConstantRefresh)] == [7]


def test_c_is_recomputed_after_a_checkpoint_restore(tmp_path: Path) -> None:
    lm = bhyt_lm()
    trainer = quiet_trainer(max_steps=3, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(lm, datamodule=TokenDataModule())
    ckpt = tmp_path / "saved.ckpt"
    trainer.save_checkpoint(ckpt)
    trained = expected_c(lm)

    fresh = bhyt_lm()  # different (initial) weights until the restore
    record = RecordC()
    trainer = quiet_trainer(callbacks=[record], max_steps=4)
    trainer.fit(fresh, datamodule=TokenDataModule(), ckpt_path=ckpt)
    assert record.expected_at_train_start == pytest.approx(trained, rel=1e-6)  # the restored weights
    assert record.at_train_start == pytest.approx(trained, rel=1e-6)  # and c computed from them


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_every_rank_gets_the_single_process_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("TORCHELASTIC_", "PL_"))}  # fmt: skip
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(FSDP2_JOB),
           str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    sys.path.insert(0, str(FSDP2_JOB.parent))
    try:
        from fsdp2_norm_refresh import batches, build
    finally:
        sys.path.remove(str(FSDP2_JOB.parent))
    from bhyt_pl.callbacks import DepthStatsCollector

    single = build()
    single.refresh_norm_constants()
    c = [float(layer.norms.c) for layer in single.layers]
    collector = DepthStatsCollector(single)
    with torch.no_grad(), collector:
        single(batches())  # both ranks' rows in one batch
    joined = collector.compute()
    for rank in ranks:
        assert rank["c"] == pytest.approx(c, rel=1e-6)
        assert rank["stats"] == pytest.approx(joined, rel=1e-5)
    assert ranks[0]["c"] == ranks[1]["c"]  # bit-identical across ranks


class _Losses(L.Callback):
    """``train/loss`` of every optimizer step and ``val/loss`` of every validation pass, as logged; optionally sends
    this process a SIGTERM after optimizer step ``sigterm_at`` (a cluster's preemption: Lightning stops after it
    and ``RunCheckpoint`` saves ``last``)."""

    def __init__(self, sigterm_at: int | None = None) -> None:
        self.sigterm_at = sigterm_at
        self.train: dict[int, float] = {}
        self.val: dict[int, float] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, *args) -> None:
        self.train[trainer.global_step] = float(outputs["loss"])
        if trainer.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_end(self, trainer: L.Trainer, *args) -> None:
        if not trainer.sanity_checking:
            self.val[trainer.global_step] = float(trainer.callback_metrics["val/loss"])


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["bhyt", "rmsnorm"])
def test_a_resume_between_two_refreshes_continues_the_uninterrupted_run_bit_for_bit(norm: str, tmp_path: Path) -> None:
    """A resume recomputed c from the restored weights, while the uninterrupted run kept the c of its last
    scheduled refresh (here: step 4) until the next one (step 8): every loss after the resume differed."""
    from test_resume import fit_args

    def fit(runs: Path, losses: _Losses, ckpt_path: Path | None = None) -> L.Trainer:
        args = fit_args(runs, 10, "--model.norm", norm, "--model.lr", "0.03", "--trainer.limit_val_batches", "1",
                        "--trainer.val_check_interval", "3", "--trainer.enable_progress_bar", "false")  # fmt: skip
        cli = main(args[1:], run=False)
        cli.trainer.callbacks[:0] = [losses, NormConstantRefresh(every_n_steps=4)]
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
        return cli.trainer

    uninterrupted = _Losses()
    reference = fit(tmp_path / "a", uninterrupted)
    assert sorted(uninterrupted.train) == list(range(1, 11)) and sorted(uninterrupted.val) == [3, 6, 9, 10]
    interrupted = _Losses(sigterm_at=6)  # between the refreshes at steps 4 and 8
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException
        fit(tmp_path / "b", interrupted)
    [last] = (tmp_path / "b").rglob("last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False, mmap=True)["global_step"] == 6
    resumed = _Losses()
    trainer = fit(tmp_path / "b", resumed, ckpt_path=last)
    assert sorted(resumed.train) == list(range(7, 11))
    assert {**interrupted.train, **resumed.train} == uninterrupted.train  # exact float equality
    assert {**interrupted.val, **resumed.val} == uninterrupted.val
    ours, theirs = (t.lightning_module.state_dict() for t in (trainer, reference))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)  # the weights at step 10, bit for bit


def test_evaluating_a_checkpoint_uses_the_c_it_was_trained_with(tmp_path: Path) -> None:
    """``validate``/``test`` with a checkpoint recomputed c from its weights: a value the run never used, so the
    validation loss of a checkpoint was not the one its run logged at that step."""
    lm, ckpt = bhyt_trained_between_refreshes(tmp_path)
    assert cached_c(lm) != pytest.approx(expected_c(lm), rel=1e-4)  # step 4's c, not the one step 6's weights give
    in_memory = quiet_trainer().validate(lm, TokenDataModule(), verbose=False)[0]["val/loss"]
    fresh = bhyt_lm()
    restored = quiet_trainer().validate(fresh, TokenDataModule(), ckpt_path=ckpt, verbose=False)
    assert cached_c(fresh) == cached_c(lm)  # exact: the saved value, not one recomputed
    assert restored[0]["val/loss"] == in_memory

    checkpoint = torch.load(ckpt, weights_only=False)  # one written before the constants were saved
    del checkpoint[NORM_CONSTANTS]
    torch.save(checkpoint, tmp_path / "older.ckpt")
    fresh = bhyt_lm()
    quiet_trainer().validate(fresh, TokenDataModule(), ckpt_path=tmp_path / "older.ckpt", verbose=False)
    assert cached_c(fresh) == pytest.approx(expected_c(lm), rel=1e-6)  # from its weights, as before

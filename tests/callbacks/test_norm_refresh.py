"""NormConstantRefresh: c follows the weights (steps, resume, FSDP2), can be configured or disabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lm_fixtures import TINY_OVERRIDES, TokenDataModule, quiet_trainer

from bhyt_pl.callbacks import NormConstantRefresh, default_refresh_interval, norm_refresh_callbacks
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

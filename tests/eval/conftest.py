"""Eval test fixtures: small models, checkpoints written by the tests, the embedded suite in a tmp dir."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.data import C4DataModule
from bhyt_pl.model import Llama
from bhyt_pl.module import LlamaLM


def small_model(norm: str = "rmsnorm", seed: int = 0, **overrides) -> Llama:
    """A randomly initialised model on the embedded tokenizer's vocabulary (8192), small and fast."""
    torch.manual_seed(seed)
    fields = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 96, "max_seq_len": 64}
    return Llama(LlamaConfig.from_name("tiny", norm=norm, **{**fields, **overrides})).eval()


def train_tiny(norm: str, out: Path, steps: int = 80, seq_len: int = 128) -> Path:
    """Train the ``tiny`` preset on the embedded corpus for ``steps`` steps; return its checkpoint path."""
    L.seed_everything(0, verbose=False)
    module = LlamaLM(preset="tiny", norm=norm, seq_len=seq_len, tokenizer="embedded", lr=3e-3, warmup_ratio=0.05)
    data = C4DataModule.embedded(seq_len=seq_len, batch_size=8, val_split=None)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, data)
    path = out / "checkpoints" / f"tiny-{norm}.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def trained_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny rmsnorm and bhyt models trained briefly in this session (a few tens of seconds each on 2 cores)."""
    out = tmp_path_factory.mktemp("trained")
    return {norm: train_tiny(norm, out / norm) for norm in ("rmsnorm", "bhyt")}


@pytest.fixture(scope="session")
def embedded_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bhyt_pl.eval.tasks import write_embedded_suite

    return write_embedded_suite(tmp_path_factory.mktemp("suite"), max_items=120)


def save_checkpoint(model: Llama, path: Path, tokenizer: str = "embedded", global_step: int = 7) -> Path:
    """A single-file checkpoint in ``LlamaLM``'s format (what ``bhyt_pl.checkpoint.read_checkpoint`` accepts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    meta = {"model_config": model.config.to_dict(), "tokenizer": tokenizer}
    torch.save({"state_dict": state, "bhyt_pl": meta, "global_step": global_step}, path)
    return path


@pytest.fixture
def small_checkpoint(tmp_path: Path) -> Path:
    """``<tmp>/run/checkpoints/last.ckpt`` of a random small model, beside a ``version_0`` log dir."""
    (tmp_path / "run" / "version_0").mkdir(parents=True)
    return save_checkpoint(small_model("bhyt"), tmp_path / "run" / "checkpoints" / "last.ckpt")

"""Eval test fixtures: small models, checkpoints written by the tests, the embedded suite in a tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Llama
from bhyt_pl.module import LlamaLM


def small_model(norm: str = "rmsnorm", seed: int = 0, **overrides) -> Llama:
    """A randomly initialised model on the embedded tokenizer's vocabulary (8192), small and fast."""
    torch.manual_seed(seed)
    fields = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 96, "max_seq_len": 64}
    return Llama(LlamaConfig.from_name("tiny", norm=norm, **{**fields, **overrides})).eval()


TRAIN_OVERRIDES = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 192, "max_seq_len": 128}
"""The ``tiny`` preset shrunk so a test can train it in well under a minute on 2 shared cores."""


def train_tiny(norm: str, out: Path, steps: int = 120, seq_len: int = 64, batch_size: int = 16) -> Path:
    """Train ``LlamaLM``'s model on packed ``[BOS] doc [EOS]`` windows of the embedded corpus with AdamW (a
    plain loop: a Trainer's per-step overhead costs more than this model's step); return its checkpoint."""
    from bhyt_pl.data.c4 import EMBEDDED_DATA_FILES, read_documents
    from bhyt_pl.data.tokenizer import load_tokenizer

    torch.manual_seed(0)
    module = LlamaLM(preset="tiny", overrides=TRAIN_OVERRIDES, norm=norm, seq_len=seq_len, tokenizer="embedded")
    module.configure_model()
    model = module.model.train()
    tok = load_tokenizer("embedded")
    stream: list[int] = []
    for i, doc in enumerate(read_documents(EMBEDDED_DATA_FILES["train"])):
        stream += [0, *tok.encode(doc["text"], add_special_tokens=False).ids, 1]
        if len(stream) > steps * batch_size * (seq_len + 1):
            break
    windows = torch.tensor(stream[: steps * batch_size * (seq_len + 1)]).view(steps, batch_size, seq_len + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    for step in range(steps):
        for group in optimizer.param_groups:  # linear warmup over 10 steps, then constant
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 10)
        loss = module.compute_loss({"input_ids": windows[step, :, :-1], "labels": windows[step, :, 1:]})[0]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return save_checkpoint(model.eval(), out / "checkpoints" / f"tiny-{norm}.ckpt", global_step=steps)


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BHyT model trained for 120 steps in this session (about 2 min of CPU time; 60 steps reach only 0.36)."""
    return train_tiny("bhyt", tmp_path_factory.mktemp("trained"))


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

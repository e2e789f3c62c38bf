"""Loading ``LlamaLM`` checkpoints for evaluation, generation and fine-tuning with one call."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Llama

__all__ = [
    "SCHEMA_VERSION",
    "LoadedModel",
    "checkpoint_entry",
    "load_model",
    "load_model_state",
    "read_checkpoint",
    "read_model_config",
]

SCHEMA_VERSION = 2
"""Version of the ``bhyt_pl`` entry of a checkpoint (docs/method.md, section 9). 1 (no
``schema_version`` key): written before run facts were bound explicitly; a ``bhyt`` scheme saved
without ``seq_len`` had T = 1024, which an unbound scheme still uses, so it reads unchanged. 2: adds
``schema_version``; ``LlamaConfig`` fields added since have defaults that rebuild older models."""


def checkpoint_entry(config: LlamaConfig, tokenizer: str | None) -> dict[str, Any]:
    """The ``bhyt_pl`` entry ``LlamaLM`` writes into its checkpoints: plain data that rebuilds the model."""
    return {"schema_version": SCHEMA_VERSION, "model_config": config.to_dict(), "tokenizer": tokenizer}


@dataclass
class LoadedModel:
    """A rebuilt model and what evaluation needs beside it."""

    model: Llama
    config: LlamaConfig
    tokenizer: str | None
    """Tokenizer name or path the model was trained with (None if the checkpoint does not say)."""
    path: Path


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """The checkpoint dict of a ``LlamaLM`` checkpoint, with a clear error otherwise.

    A single file (any strategy but sharded ones) or a sharded distributed-checkpoint folder
    (FSDP2), which is consolidated in memory. ``mmap=True`` maps a file's tensors lazily (cheap
    when only the config is needed)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        from bhyt_pl.checkpoint_io import load_sharded_checkpoint

        checkpoint = load_sharded_checkpoint(path)
    else:
        checkpoint = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    if "bhyt_pl" not in checkpoint or "state_dict" not in checkpoint:
        raise ValueError(f"{str(path)!r} is not a bhyt_pl LlamaLM checkpoint (no 'bhyt_pl' model config entry)")
    version = checkpoint["bhyt_pl"].get("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(
            f"{str(path)!r} has checkpoint schema_version {version!r}; this bhyt_pl reads versions 1 to "
            f"{SCHEMA_VERSION}: upgrade bhyt_pl to load it"
        )
    return checkpoint


def read_model_config(path: str | Path) -> LlamaConfig:
    """The ``LlamaConfig`` stored in a ``LlamaLM`` checkpoint, without loading its tensors."""
    return LlamaConfig(**read_checkpoint(path, mmap=True)["bhyt_pl"]["model_config"])


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The ``Llama`` state dict inside a ``LlamaLM`` checkpoint (keys without the ``model.`` prefix)."""
    state = read_checkpoint(path)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> LoadedModel:
    """Rebuild the model saved in a ``LlamaLM`` checkpoint, in eval mode, whatever norm it uses.

    Example:
        >>> loaded = load_model("runs/tiny/version_0/checkpoints/last.ckpt")  # doctest: +SKIP
        >>> loaded.model.generate(prompt_ids, max_new_tokens=20)  # doctest: +SKIP
    """
    checkpoint = read_checkpoint(path, map_location)
    meta = checkpoint["bhyt_pl"]
    config = LlamaConfig(**meta["model_config"])
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device=map_location)
    state = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(state)  # the post-load hook recomputes BHyT's c from these weights
    if dtype is not None:
        model.to(dtype)
    return LoadedModel(model.eval(), config, meta.get("tokenizer"), Path(path))

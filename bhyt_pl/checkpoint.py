"""Loading ``LlamaLM`` checkpoints for evaluation, generation and fine-tuning with one call, and the
check that a resumed run has the configuration its checkpoint was trained with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bhyt_pl.checkpoint_io import (
    COMPLETE,
    TRAINER_STATE,
    checkpoint_problem,
    load_sharded_checkpoint,
    sharded_checkpoint_problem,
    unusable_checkpoint_message,
)
from bhyt_pl.config import LlamaConfig
from bhyt_pl.errors import UsageError
from bhyt_pl.model import Llama

__all__ = [
    "NORM_CONSTANTS",
    "RESUME_MAY_CHANGE",
    "RESUME_MUST_MATCH",
    "SCHEMA_VERSION",
    "LoadedModel",
    "checkpoint_entry",
    "load_model",
    "load_model_state",
    "read_checkpoint",
    "read_checkpoint_metadata",
    "read_model_config",
    "resolved_model_config",
    "resume_mismatches",
    "saved_norm_constants",
]

RESUME_MUST_MATCH = ("seq_len", "tokenizer", "lr", "min_lr_ratio", "warmup_ratio", "warmup_steps", "weight_decay",
                     "betas", "adam_eps")  # fmt: skip
"""``LlamaLM`` arguments a resume must repeat, besides the whole model config (preset, overrides, norm,
norm_args): they decide the data windows, the tokens and the optimisation the checkpoint continues."""

RESUME_MAY_CHANGE = ("compile", "activation_checkpointing", "fsdp_mixed_precision", "init_checkpoint")
"""``LlamaLM`` arguments a resume may change: how the same computation runs, or (``init_checkpoint``)
weights the checkpoint's replace anyway. Every ``trainer.*`` setting may change too (``max_steps`` to
train longer, devices, precision, logging), and the ``data`` module except its sequence length."""


SCHEMA_VERSION = 2
"""Version of the ``bhyt_pl`` entry of a checkpoint (docs/method.md, section 9). 1 (no
``schema_version`` key): written before run facts were bound explicitly; a ``bhyt`` scheme saved
without ``seq_len`` had T = 1024, which an unbound scheme still uses, so it reads unchanged. 2: adds
``schema_version``; ``LlamaConfig`` fields added since have defaults that rebuild older models."""


NORM_CONSTANTS = "norm_constants"
"""The checkpoint entry holding the weight-derived norm constants (BHyT's ``c``) in use at the saved step:
``{module name: Llama.norm_constants()}`` for every ``Llama`` of the LightningModule (``model`` in ``LlamaLM``).
``NormConstantRefresh`` writes it; between two of its scheduled refreshes these differ from the ones the saved
weights give, and a resume or an evaluation puts them back."""


def saved_norm_constants(checkpoint: Mapping[str, Any]) -> dict[str, dict[str, torch.Tensor]] | None:
    """A checkpoint's ``NORM_CONSTANTS`` entry, or None: one written without a ``NormConstantRefresh`` (a scheme
    without constants), weights only, or before the constants were saved."""
    saved = checkpoint.get(NORM_CONSTANTS)
    if not isinstance(saved, Mapping):
        return None
    return {name: dict(constants) for name, constants in saved.items()}


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
        checkpoint = load_sharded_checkpoint(path)
    else:
        checkpoint = _torch_load(path, map_location=map_location, mmap=mmap)
    if not isinstance(checkpoint, dict) or "bhyt_pl" not in checkpoint or "state_dict" not in checkpoint:
        raise UsageError(f"{str(path)!r} is not a bhyt_pl LlamaLM checkpoint (no 'bhyt_pl' model config entry)")
    version = checkpoint["bhyt_pl"].get("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise UsageError(
            f"{str(path)!r} has checkpoint schema_version {version!r}; this bhyt_pl reads versions 1 to "
            f"{SCHEMA_VERSION}: upgrade bhyt_pl to load it"
        )
    return checkpoint


def _torch_load(path: Path, **kwargs: Any) -> Any:
    """``torch.load`` whose failure on a file that is not a complete checkpoint is one line naming the file,
    what is wrong and the newest complete checkpoint beside it (not a pickle opcode, nor, for a text file,
    torch's advice on ``mmap``)."""
    problem = checkpoint_problem(path)
    if problem is None:
        try:
            return torch.load(path, weights_only=False, **kwargs)
        except Exception as err:  # any unpickling or zip error means the same thing to the user
            problem = f"torch cannot read it ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
    raise UsageError(unusable_checkpoint_message(path, problem)) from None


def read_checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """A ``LlamaLM`` checkpoint's entries without loading its tensors: ``bhyt_pl`` (the model config),
    ``hyper_parameters``, ``global_step``, ... A file is memory-mapped; a sharded folder's ``meta.pt`` is read."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        if not any((path / name).exists() for name in (TRAINER_STATE, COMPLETE, ".metadata")):
            raise UsageError(f"{str(path)!r} is a folder but not a sharded checkpoint (no {TRAINER_STATE})")
        problem = sharded_checkpoint_problem(path)
        if problem is not None:
            raise UsageError(unusable_checkpoint_message(path, problem))
        checkpoint = _torch_load(path / TRAINER_STATE, map_location="cpu")
    else:
        checkpoint = _torch_load(path, map_location="cpu", mmap=True)
    if not isinstance(checkpoint, dict) or "bhyt_pl" not in checkpoint:
        raise UsageError(f"{str(path)!r} is not a bhyt_pl LlamaLM checkpoint (no 'bhyt_pl' model config entry)")
    return checkpoint


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def resolved_model_config(config: LlamaConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A model config as its model is built: ``LlamaConfig``'s own canonical spelling of every field
    (an alias such as ``qk_norm: true`` becomes the mode it names) and ``norm_args`` with every argument
    of the norm scheme, defaults filled in (``NormScheme.hparams``). Two configs that build the same model
    resolve equal however they were spelled (a norm overlay listing its defaults, or none). Run facts are
    compared as recorded: a config is bound before it is saved (``LlamaConfig.bind``); an unbound one as the
    value the scheme falls back to (``NormScheme.fallback_run_facts``), which a model built unbound records."""
    if not isinstance(config, LlamaConfig):
        config = LlamaConfig(**config)
    resolved = config.to_dict()
    scheme = config.norm_scheme()
    resolved["norm_args"] = {**scheme.hparams(), **scheme.fallback_run_facts()}
    return resolved


def resume_mismatches(config: LlamaConfig, hparams: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> list[str]:
    """One line per setting where this run differs from the checkpoint it resumes, each named as the
    command line names it: the model config (``model.preset``, ``model.norm``, ``model.norm_args.<key>``
    including BHyT's ``seq_len``, ``model.overrides.<field>``) and ``RESUME_MUST_MATCH``. Empty: compatible.

    Both sides are compared resolved (``resolved_model_config``), so only a real difference is reported,
    as ``checkpoint <value>, this run <value>``; when the norm differs its arguments are not listed."""
    saved_config = resolved_model_config(checkpoint["bhyt_pl"]["model_config"])
    ours = resolved_model_config(config)
    lines = []

    def differ(label: str, saved: Any, current: Any) -> None:
        if _plain(saved) != _plain(current):
            lines.append(f"{label}: checkpoint {saved!r}, this run {current!r}")

    for key in sorted(set(saved_config) | set(ours)):
        saved, current = saved_config.get(key), ours.get(key)
        if key == "norm_args":
            if saved_config["norm"] == ours["norm"]:
                for arg in sorted(set(saved) | set(current)):
                    differ(f"model.norm_args.{arg}", saved.get(arg), current.get(arg))
        else:
            label = {"name": "model.preset", "norm": "model.norm"}.get(key, f"model.overrides.{key}")
            differ(label, saved, current)
    saved_hparams = checkpoint.get("hyper_parameters") or {}
    for key in RESUME_MUST_MATCH:
        if key in saved_hparams and key in hparams:
            differ(f"model.{key}", saved_hparams[key], hparams[key])
    return lines


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

    Weight-derived norm constants (BHyT's ``c``) are the ones the model was using at the saved step when the
    checkpoint carries them (``NormConstantRefresh`` stores them in every training checkpoint), so evaluating a
    checkpoint gives what the training run's own validation gave at that step; an older checkpoint gets them
    recomputed from its weights.

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
    saved = saved_norm_constants(checkpoint) or {}
    if "model" in saved:  # ``LlamaLM.model``: the values in use at the saved step
        model.set_norm_constants(saved["model"])
    if dtype is not None:
        model.to(dtype)
    return LoadedModel(model.eval(), config, meta.get("tokenizer"), Path(path))

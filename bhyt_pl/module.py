"""``LlamaLM``: the LightningModule that trains a registry-normed Llama on ``input_ids``/``labels`` batches."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics import MeanMetric

from bhyt_pl.checkpoint import checkpoint_entry
from bhyt_pl.flops import training_flops_per_token
from bhyt_pl.loss import LOSS_IMPLS
from bhyt_pl.model import Llama
from bhyt_pl.norms import NormScheme
from bhyt_pl.optim import cosine_with_warmup, parameter_groups
from bhyt_pl.parallelize import load_full_state_dict, shard_model
from bhyt_pl.run_config import build_run_config, data_run_facts, data_tokenizer, resolve_unbound
from bhyt_pl.validation import raise_if_problems

__all__ = ["LlamaLM"]

log = logging.getLogger(__name__)


class LlamaLM(L.LightningModule):
    """Causal language modelling with a Llama whose norms come from the registry.

    Made to be subclassed: override ``compute_loss`` (e.g. add an auxiliary term) or any hook. With the CLI or
    a plain ``Trainer``, the facts of the run (``seq_len``, ``batch_size``, the tokenizer) come from the data
    module it is trained with: the CLI links them, and ``setup`` takes them from ``trainer.datamodule``
    before the model is built (``bind_run_facts``); a value given here must agree with the data module's.

    Example:
        >>> import lightning as L
        >>> from bhyt_pl.data import C4DataModule
        >>> data = C4DataModule(data_files="embedded", tokenizer="embedded", seq_len=128, batch_size=4)
        >>> model = LlamaLM(preset="tiny", norm="bhyt")
        >>> L.Trainer(max_steps=20, accelerator="cpu").fit(model, data)  # doctest: +SKIP
        >>> model.config.norm_args["seq_len"]  # doctest: +SKIP
        128

    Args:
        preset: model preset (``bhyt_pl.PRESETS``): ``tiny``, ``llama-1b``, ...
        overrides: ``LlamaConfig`` fields that replace the preset's, e.g. ``{"n_layers": 8}``.
        norm: a registered norm name (``rmsnorm``, ``bhyt``, ...) or a ``NormScheme`` instance
            (``class_path``/``init_args`` in YAML) for a tuned or custom scheme.
        norm_args: constructor arguments for a norm given by name, e.g. ``{"lambda_attn": 1.0}``.
        seq_len: training sequence length ``T`` of this run, its most common run fact; None takes the data
            module's (linked by the CLI, read in ``setup`` otherwise). Bound into the norm scheme (BHyT's
            ``c = ||W_V W_O||_F^2 / (T d)``) unless the scheme's own arguments set it; with ``init_checkpoint`` it
            replaces the pretraining T. A value that differs from the data module's is an error.
        run_facts: every other fact about this run a norm scheme may declare (``NormScheme.run_facts``), e.g.
            ``{"batch_size": 8}``; None takes the data module's ``run_facts()``. The config is built by
            ``bhyt_pl.run_config.build_run_config`` from these, ``seq_len`` and the model arguments.
        tokenizer: tokenizer name or path the data uses, stored in checkpoints so evaluation can rebuild it;
            None takes the data module's.
        lr: peak learning rate.
        min_lr_ratio: the cosine schedule ends at ``lr * min_lr_ratio``.
        warmup_ratio: linear warmup over this fraction of the total optimizer steps (None: the norm scheme's
            recipe where it declares one, ``NormScheme.training_defaults``, else 0.05).
        warmup_steps: warmup length in steps; overrides ``warmup_ratio`` when set (None: the scheme's recipe
            where it declares one, e.g. nGPT's 0, else derived from ``warmup_ratio``).
        weight_decay: AdamW weight decay on matrices; never on norm parameters (``parameter_groups``). None:
            the scheme's recipe where it declares one (nGPT: 0), else 0.1.
        betas: AdamW betas.
        adam_eps: AdamW epsilon.
        init_checkpoint: start from the weights of this ``LlamaLM`` checkpoint (e.g. for SFT). The
            architecture and norm then come from the checkpoint; ``overrides`` still apply on top
            (e.g. a longer ``max_seq_len``), ``norm_args`` update the checkpoint's norm arguments
            (``recipes/sft/norms/bhyt.yaml``: ``lambda_final: 3``), ``preset`` and ``norm`` are ignored, and the
            run's ``seq_len`` is bound as BHyT's T. Parameters that only the updated norm arguments create
            (a BHyT final norm's ``lambda_``) keep their initial value; every other key must match.
        compile: ``torch.compile`` each block (before any sharding, as torchtitan orders it).
        activation_checkpointing: recompute each block's activations in backward instead of storing them.
        fsdp_mixed_precision: under FSDP2 (``ModelParallelStrategy``), keep bf16 copies of the parameters
            for compute and reduce gradients in float32 (use with ``precision: 32-true``; GPU).
        loss_impl: how the loss is computed from the final hidden states (``bhyt_pl.loss``): ``chunked``
            (a chunk of tokens at a time, never the whole batch's float32 logits), ``liger`` (liger-kernel's
            fused kernel; CUDA, ``pip install liger-kernel``), ``plain`` (full logits, the reference) or
            ``auto`` (``liger`` on CUDA when installed, else ``chunked``).
        loss_chunk_tokens: tokens per chunk of the chunked loss; None sizes chunks to about 2^25 logits.
    """

    def __init__(
        self,
        preset: str = "tiny",
        overrides: dict[str, Any] | None = None,
        norm: str | NormScheme = "rmsnorm",
        norm_args: dict[str, Any] | None = None,
        seq_len: int | None = None,
        run_facts: dict[str, Any] | None = None,
        tokenizer: str | None = None,
        lr: float = 3e-4,
        min_lr_ratio: float = 0.1,
        warmup_ratio: float | None = None,
        warmup_steps: int | None = None,
        weight_decay: float | None = None,
        betas: tuple[float, float] = (0.9, 0.95),
        adam_eps: float = 1e-8,
        init_checkpoint: str | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
        fsdp_mixed_precision: bool = False,
        loss_impl: str = "auto",
        loss_chunk_tokens: int | None = None,
    ) -> None:
        super().__init__()
        facts = dict(run_facts or {})
        if seq_len is not None and facts.setdefault("seq_len", seq_len) != seq_len:
            raise ValueError(f"seq_len={seq_len} and run_facts['seq_len']={facts['seq_len']} differ; give one")
        self.init_config = None
        if init_checkpoint:
            from bhyt_pl.checkpoint import read_model_config

            self.init_config = read_model_config(init_checkpoint)  # what load_initial_weights expects to find
        self._config_args = (preset, norm, norm_args, overrides)
        self._facts = facts
        """Run facts given here or bound since (``bind_run_facts``): a data module must agree with them."""
        # no warning about unbound facts yet: ``setup`` may still learn them from the data module
        self.config = build_run_config(preset, norm, norm_args, overrides, facts, base=self.init_config,
                                       warn_unbound=False)  # fmt: skip
        given = {"weight_decay": weight_decay, "warmup_ratio": warmup_ratio, "warmup_steps": warmup_steps}
        resolved, self.training_sources = resolve_training_defaults(self.config.norm_scheme(), given)
        weight_decay, warmup_ratio, warmup_steps = (resolved[k] for k in given)
        problems = []
        if loss_impl not in LOSS_IMPLS:
            problems.append(f"loss_impl must be one of {', '.join(LOSS_IMPLS)}; got {loss_impl!r}")
        if loss_chunk_tokens is not None and loss_chunk_tokens < 1:
            problems.append(f"loss_chunk_tokens must be >= 1 or null, got {loss_chunk_tokens}")
        if not lr > 0:
            problems.append(f"lr must be > 0, got {lr}")
        if not 0 <= min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if not 0 <= warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if warmup_steps is not None and warmup_steps < 0:
            problems.append(f"warmup_steps must be >= 0, got {warmup_steps}")
        if weight_decay < 0:
            problems.append(f"weight_decay must be >= 0, got {weight_decay}")
        if not all(0 <= b < 1 for b in betas):
            problems.append(f"betas must be in [0, 1), got {betas}")
        raise_if_problems("LlamaLM arguments", problems)
        # hyperparameters are plain data: the norm is stored as its registry name and resolved arguments,
        # also in hparams_initial, which hparams.yaml and TensorBoard's HPARAMS are written from; the
        # optimisation values as resolved (the scheme's recipe or the defaults), so a resume compares values
        self.save_hyperparameters(ignore=["norm", "norm_args"])
        # seq_len as the run gave it, either way (Lightning merges it with the data module's own seq_len)
        self.save_hyperparameters(
            {
                **self.hparams,
                **resolved,
                "norm": self.config.norm,
                "norm_args": dict(self.config.norm_args),
                "seq_len": facts.get("seq_len"),
            }
        )
        self.model: Llama | None = None
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.flops_per_batch: float | None = None
        self._flops_shape: tuple[int, int] | None = None

    # ------------------------------------------------------------------ config and model
    def setup(self, stage: str) -> None:
        """Take the run facts and the tokenizer of the data module this model is trained with, before the model
        is built (``configure_model`` runs after ``setup``), and say where the optimisation settings came from.

        Through the CLI the data module's facts were linked already and this changes nothing; in a plain
        ``Trainer.fit(model, datamodule)`` it is what binds BHyT's T to the data's sequence length. Loaders
        passed without a data module give no facts: pass them to ``LlamaLM`` or ``bind_run_facts``."""
        datamodule = self.trainer.datamodule
        if datamodule is not None:
            self.bind_run_facts(data_run_facts(datamodule), data_tokenizer(datamodule))
        if stage == "fit":
            settings = describe_training_settings(self.hparams, self.training_sources)
            rank_zero_info(f"LlamaLM: training settings {settings}")

    def bind_run_facts(self, facts: Mapping[str, Any], tokenizer: str | None = None) -> None:
        """Bind the facts of the run that trains this model (a data module's ``run_facts()``: ``seq_len``,
        ``batch_size``) and its tokenizer: the config is rebuilt with them (``build_run_config``) and the
        hyperparameters saved again, so ``hparams.yaml`` and checkpoints carry the bound values.

        A fact or tokenizer this module was given (or bound before) that differs is a ``ValueError`` naming
        both values, raised before any work; so is a change after the model was built for other facts.
        """
        facts = {k: v for k, v in facts.items() if v is not None}
        given_tokenizer = self.hparams.tokenizer
        problems = [
            f"LlamaLM has {key}={self._facts[key]!r}, the data module {key}={value!r}"
            for key, value in sorted(facts.items())
            if self._facts.get(key) is not None and self._facts[key] != value
        ]
        if tokenizer is not None and given_tokenizer is not None and tokenizer != given_tokenizer:
            problems.append(f"LlamaLM has tokenizer={given_tokenizer!r}, the data module tokenizer={tokenizer!r}")
        if problems:
            raise ValueError(
                "; ".join(problems) + ": give LlamaLM the data module's values, or leave them unset (None) and it "
                "takes them from the data module it is trained with"
            )
        merged = {**facts, **self._facts}
        tokenizer = given_tokenizer if given_tokenizer is not None else tokenizer
        if merged == self._facts and tokenizer == given_tokenizer:
            return  # the CLI linked them already, or this data module was seen before
        preset, norm, norm_args, overrides = self._config_args
        config = build_run_config(preset, norm, norm_args, overrides, merged, base=self.init_config,
                                  warn_unbound=False)  # fmt: skip
        if self.model is not None and config.to_dict() != self.config.to_dict():
            raise ValueError(
                f"LlamaLM's model was built before it knew this run's facts {facts}, which change its norm arguments "
                f"from {dict(self.config.norm_args)} to {dict(config.norm_args)}: give them to LlamaLM (seq_len=..., "
                "run_facts=...) before its model is built, or let the Trainer build it (configure_model runs after "
                "setup takes the data module's facts)"
            )
        self.config, self._facts = config, merged
        self.save_hyperparameters(
            {
                **self.hparams,
                "norm_args": dict(config.norm_args),
                "seq_len": merged.get("seq_len"),
                "run_facts": merged,
                "tokenizer": tokenizer,
            }
        )

    def configure_model(self) -> None:
        """Build the model here (not in ``__init__``) so sharded strategies can build it on the meta device.

        Under ``ModelParallelStrategy`` (FSDP2) the model is built on the meta device, each block is
        ``fully_shard``-ed and then the root, and only the local shards are materialised and
        initialised (torchtitan's order: compile, shard, ``to_empty``, init).
        """
        if self.model is not None:
            return
        # the model is built now: a fact still unknown takes the scheme's fallback, with a warning naming it, and the
        # config, hparams.yaml and checkpoints record that value (what the model is built with)
        config = resolve_unbound(self.config)
        if config is not self.config:
            self.config = config
            self.save_hyperparameters({**self.hparams, "norm_args": dict(config.norm_args)})
        mesh = self._data_parallel_mesh()
        if mesh is None:
            model = Llama(self.config)
        else:
            with torch.device("meta"):
                model = Llama(self.config)
        model.activation_checkpointing = self.hparams.activation_checkpointing
        model.loss_impl = self.hparams.loss_impl
        model.loss_chunk_tokens = self.hparams.loss_chunk_tokens
        if self.hparams.compile:
            for layer in model.layers:
                layer.compile()  # in place: state-dict keys stay unprefixed
        if mesh is not None:
            self.shard(model, mesh)
            model.to_empty(device=self.trainer.strategy.root_device)
            model.reset_parameters()  # the init policy on the local shards; c from gathered weights
        self.model = model
        if self.hparams.init_checkpoint:
            self.load_initial_weights(self.hparams.init_checkpoint)

    def _data_parallel_mesh(self):  # -> DeviceMesh | None
        try:
            mesh = self.device_mesh  # set by ModelParallelStrategy before configure_model
        except (AttributeError, RuntimeError):
            return None
        if mesh is None:
            return None
        return mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh

    def shard(self, model: Llama, mesh) -> None:  # noqa: ANN001 - DeviceMesh
        """FSDP2 sharding (``bhyt_pl.parallelize.shard_model``), bf16 compute copies with
        ``fsdp_mixed_precision``."""
        if self.hparams.fsdp_mixed_precision:
            shard_model(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            shard_model(model, mesh)

    def load_initial_weights(self, path: str) -> None:
        """Load a ``LlamaLM`` checkpoint's weights into the (possibly sharded) model.

        Strict about every key, except parameters that exist only because the norm arguments changed
        from the checkpoint's (``init_config``): those keep their initial values (a BHyT final norm's
        ``lambda_`` starts at ``lambda_final``; its gain is the checkpoint's RMSNorm gain, same key).
        """
        from bhyt_pl.checkpoint import load_model_state

        state = load_model_state(path)
        expected = set(self.model.state_dict())
        new_keys: set[str] = set()
        if self.init_config is not None:
            with torch.device("meta"):
                new_keys = expected - set(Llama(self.init_config).state_dict())
        missing, unexpected = sorted(expected - new_keys - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"init_checkpoint {path!r} does not match the model: missing keys {missing}, unexpected keys "
                f"{unexpected}"
            )
        if new_keys:
            log.info("init_checkpoint: %s keep their initial values (new with the norm arguments)", sorted(new_keys))
        load_full_state_dict(self.model, state, strict=not new_keys)
        self.model.refresh_norm_constants()  # c from the loaded weights (every rank, sharded or not)

    def configure_callbacks(self) -> list[L.Callback]:
        """Callbacks the model itself needs (added automatically): the norm-constant refresh for BHyT and a
        validation pass at the last step (``ValidateAtLastStep``), each unless ``trainer.callbacks`` already
        holds one (a ``NormConstantRefresh`` configured or disabled with ``enabled=False``), which Lightning
        would otherwise replace with this default."""
        from bhyt_pl.callbacks import final_validation_callbacks, norm_refresh_callbacks

        needs_refresh = self.config.norm_scheme().needs_constant_refresh
        return norm_refresh_callbacks(self.trainer, needs_refresh) + final_validation_callbacks(self.trainer)

    def refresh_norm_constants(self) -> None:
        """Recompute weight-derived norm constants (BHyT's ``c``) from the current weights."""
        if self.model is not None:
            self.model.refresh_norm_constants()

    # ------------------------------------------------------------------ steps
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any):
        """Logits [B, T, V]; with ``labels``, ``LossOutput(loss, tokens)`` from the chunked loss (``Llama.forward``)."""
        if labels is None:
            return self.model(input_ids, **kwargs)
        return self.model(input_ids, labels=labels, **kwargs)

    def compute_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean next-token cross-entropy over supervised positions, and their count.

        ``batch["labels"][:, t]`` is the target at position t; -100 marks unsupervised positions.
        Computed inside the model's forward from the final hidden states (``loss_impl``), so the batch's
        float32 logits never exist; a subclass that needs logits can call ``self(input_ids)``.
        """
        out = self(batch["input_ids"], labels=batch["labels"])
        return out.loss, out.tokens

    def expected_flops_per_batch(self, batch_size: int) -> float | None:
        """Training FLOPs of a batch of ``batch_size`` rows of ``seq_len`` tokens: what ``flops_per_batch``
        becomes at the first full batch (shown by the model summary before training); None when the run
        gave no ``seq_len``."""
        seq_len = self.hparams.seq_len
        if seq_len is None:
            return None
        return batch_size * seq_len * training_flops_per_token(self.config, seq_len)

    def _update_flops(self, batch: dict[str, torch.Tensor]) -> None:
        shape = tuple(batch["input_ids"].shape)
        if shape != self._flops_shape:
            self._flops_shape = shape
            self.flops_per_batch = shape[0] * shape[1] * training_flops_per_token(self.config, shape[1])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self._update_flops(batch)
        loss, _ = self.compute_loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/perplexity", torch.exp(loss.detach().clamp(max=30)))
        return loss

    def on_validation_epoch_start(self) -> None:
        # fresh states in this loop's grad mode: a previous ``trainer.validate`` ran under inference
        # mode, and its inference tensors cannot be updated by fit's validation (no_grad mode)
        self.val_loss.reset()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, n = self.compute_loss(batch)
        self.val_loss.update(loss, weight=n)  # token-weighted mean over the whole validation set
        self.log("val/loss", self.val_loss, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        # logged after the metric above is computed and synced; exp of the token-level mean NLL
        self.log("val/perplexity", torch.exp(self.val_loss.compute().clamp(max=30)), sync_dist=True)

    def on_test_epoch_start(self) -> None:
        self.test_loss.reset()

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, n = self.compute_loss(batch)
        self.test_loss.update(loss, weight=n)
        self.log("test/loss", self.test_loss)

    def on_test_epoch_end(self) -> None:
        self.log("test/perplexity", torch.exp(self.test_loss.compute().clamp(max=30)), sync_dist=True)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """Per-sequence summed negative log-likelihood and supervised token count (document scoring)."""
        labels = batch["labels"]
        nll = self(batch["input_ids"], labels=labels, loss_reduction="none").loss  # [B, T], 0 where unsupervised
        return {"nll": nll.sum(dim=1), "tokens": (labels != -100).sum(dim=1)}

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer = torch.optim.AdamW(
            parameter_groups(self.model, hp.weight_decay), lr=hp.lr, betas=tuple(hp.betas), eps=hp.adam_eps
        )
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total) or total <= 0:
            raise ValueError("LlamaLM needs a finite schedule: set trainer.max_steps (or max_epochs on finite data)")
        total = int(total)
        warmup = hp.warmup_steps if hp.warmup_steps is not None else int(hp.warmup_ratio * total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: cosine_with_warmup(step, warmup, total, hp.min_lr_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        self.model.constrain_weights()  # the scheme's weight constraint after every step (nGPT); else a no-op

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # a checkpoint carries the plain-data config so it can be rebuilt without this class's arguments
        checkpoint["bhyt_pl"] = checkpoint_entry(self.config, self.hparams.tokenizer)


TRAINING_DEFAULTS = {"weight_decay": 0.1, "warmup_ratio": 0.05, "warmup_steps": None}
"""``LlamaLM``'s optimisation defaults where neither the user nor the norm scheme's recipe sets a value."""

ALTERNATIVE_SETTINGS = (("warmup_ratio", "warmup_steps"),)
"""Settings that say the same thing two ways (``configure_optimizers`` prefers ``warmup_steps``): once the user
sets one of a group, the scheme's recipe supplies none of it, so it cannot override the user's choice."""


GIVEN = "given"
"""The source ``resolve_training_defaults`` records for a value the caller set; the CLI replaces it with the file
or the command line that set it (``BHyTCLI``)."""


def resolve_training_defaults(scheme: NormScheme, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``given`` (optimisation settings by ``LlamaLM`` argument name, None where the user set nothing) with each
    unset one taken from the scheme's ``training_defaults``, else ``TRAINING_DEFAULTS``; a group of
    ``ALTERNATIVE_SETTINGS`` takes nothing from the scheme when the user set any of it. Used by ``LlamaLM`` and
    so by ``fit`` and ``study``: precedence, lowest first, is the scheme's declared defaults (or LlamaLM's),
    then whatever the caller set (in the CLI: base recipe < norm overlay < command line, as later configs win).

    Returns:
        ``(values, sources)``: the resolved value of each setting and where it came from (``GIVEN``,
        ``"norm <name>"`` or ``"LlamaLM default"``), which ``describe_training_settings`` prints.

    Example:
        >>> from bhyt_pl.norms import build_norm_scheme
        >>> resolve_training_defaults(build_norm_scheme("ngpt"), {"weight_decay": None, "warmup_ratio": 0.1})
        ({'weight_decay': 0.0, 'warmup_ratio': 0.1}, {'weight_decay': 'norm ngpt', 'warmup_ratio': 'given'})
    """
    out = dict(given)
    sources = {k: GIVEN for k, v in out.items() if v is not None}
    chosen = {k for group in ALTERNATIVE_SETTINGS if set(sources).intersection(group) for k in group}
    from_scheme = {k: v for k, v in scheme.training_defaults.items() if k in out and out[k] is None and k not in chosen}
    for key, value in out.items():
        if value is None:
            out[key] = from_scheme.get(key, TRAINING_DEFAULTS.get(key))
            sources[key] = f"norm {scheme.name}" if key in from_scheme else "LlamaLM default"
    return out, {k: sources[k] for k in out}


def describe_training_settings(values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """``weight_decay=0.0 (norm ngpt), warmup_ratio=0.05 (LlamaLM default; warmup_steps wins), ...``: the
    resolved optimisation settings with their sources, as the fit's log line prints them."""
    parts = []
    for key, source in sources.items():
        note = source
        if key == "warmup_ratio" and values.get("warmup_steps") is not None:
            note += "; warmup_steps wins"  # configure_optimizers prefers warmup_steps
        parts.append(f"{key}={values[key]} ({note})")
    return ", ".join(parts)

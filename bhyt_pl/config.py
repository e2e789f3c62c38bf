"""``LlamaConfig``: one dataclass that fully describes a model, and the named presets (docs/method.md, section 5)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bhyt_pl.validation import raise_if_problems

if TYPE_CHECKING:
    from bhyt_pl.norms import NormScheme

__all__ = ["LLAMA3_ROPE_SCALING", "LlamaConfig", "PRESETS", "ROPE_SCALING_KEYS"]

LLAMA3_ROPE_SCALING: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""Llama 3's RoPE frequency scaling as the Llama-3.2 configs carry it (docs/method.md, models)."""
ROPE_SCALING_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
"""The keys of ``LlamaConfig.rope_scaling`` (Hugging Face's ``rope_scaling``/``rope_parameters`` names)."""


@dataclass
class LlamaConfig:
    """A Llama-3.2-style decoder: RoPE, SwiGLU, grouped-query attention, no biases.

    Plain data (names and numbers): a checkpoint stores ``dataclasses.asdict(config)`` and the
    model is rebuilt from it. The norm scheme is resolved from the registry once, when the config is
    built, and held (``norm_scheme()``); build a run's config with ``bhyt_pl.run_config.build_run_config``.
    """

    name: str = "custom"
    """Preset name this config came from (informational)."""

    # --- sizes ---
    vocab_size: int = 8192
    """Rows of the embedding table; at least the tokenizer's vocabulary."""
    dim: int = 128
    """Hidden size ``d`` of the residual stream."""
    n_layers: int = 4
    """Number of transformer blocks ``L``."""
    n_heads: int = 4
    """Query heads."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``n_heads``."""
    head_dim: int | None = None
    """Per-head width; ``dim // n_heads`` when None."""
    mlp_dim: int = 512
    """SwiGLU inner width."""
    max_seq_len: int = 1024
    """Longest sequence the model accepts (training windows, KV cache, evaluation)."""

    # --- details ---
    rope_theta: float = 500000.0
    """RoPE base frequency (Llama-3.2: 500000)."""
    rope_scaling: dict[str, Any] | None = None
    """Llama 3 RoPE frequency scaling, or None for plain RoPE: ``{rope_type: llama3, factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings}`` (the paper presets use
    Llama-3.2's ``LLAMA3_ROPE_SCALING``). Wavelengths longer than ``original / low_freq_factor``
    are divided by ``factor``, those shorter than ``original / high_freq_factor`` are kept, and
    those between are interpolated; this changes the rotation at every position."""
    tie_embeddings: bool = True
    """Share the embedding matrix with the output projection."""
    init_std: float = 0.02
    """Standard deviation of the N(0, std) init of every linear and embedding weight."""
    qk_norm: bool | str = False
    """QK-norm, an RMSNorm of queries and keys before RoPE, with gains ``attn.q_norm.weight`` and
    ``attn.k_norm.weight``: ``"head"`` over each head's hd (Qwen3, Gemma 3; gains ``[hd]``), ``"full"``
    over the whole projection before the head split (OLMo 2; gains ``[H * hd]`` and ``[K * hd]``),
    ``false`` for none. ``true`` is an alias of ``"head"`` (older configs and checkpoints). Combines with
    every scheme except those that set their own attention norms (``hybridnorm``)."""
    qk_norm_eps: float = 1e-6
    """Epsilon of the QK-norm RMSNorms (OLMo-2's and Qwen3's 1e-6)."""

    # --- normalization ---
    norm: str = "rmsnorm"
    """Registered norm scheme (``bhyt_pl.norms.registered_norms()``)."""
    norm_args: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of the norm scheme, e.g. ``{"lambda_attn": 1.0}``."""

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads if self.n_heads > 0 else 0
        problems = []
        for f in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim", "max_seq_len"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{f} must be a positive int, got {value!r}")
        if not problems and self.n_heads % self.n_kv_heads:
            problems.append(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if not problems and self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            problems.append(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.init_std > 0:
            problems.append(f"init_std must be > 0, got {self.init_std}")
        from bhyt_pl.norms.base import QK_NORMS

        if self.qk_norm is True:
            self.qk_norm = "head"
        if self.qk_norm is not False and self.qk_norm not in QK_NORMS:
            problems.append(f"qk_norm must be false, 'head', 'full' or true (an alias of 'head'), got {self.qk_norm!r}")
        if not self.qk_norm_eps > 0:
            problems.append(f"qk_norm_eps must be > 0, got {self.qk_norm_eps}")
        if self.rope_scaling is not None:
            problems += _rope_scaling_problems(self.rope_scaling)
            if isinstance(self.rope_scaling, dict):
                self.rope_scaling = dict(self.rope_scaling)  # never share a preset's dict
        if not isinstance(self.norm_args, dict):
            problems.append(
                f"norm_args must be a mapping of constructor arguments, got {type(self.norm_args).__name__}"
            )
        raise_if_problems("LlamaConfig", problems)
        from bhyt_pl.norms import build_norm_scheme

        # resolved once, here: unknown names and bad norm arguments fail before any work, and every reader
        # (the model, the trainer, export) gets this instance instead of resolving the strings again
        self._scheme: NormScheme = build_norm_scheme(self.norm, **self.norm_args)
        scheme = self._scheme
        wrong = {k: v for k, v in scheme.model_settings.items() if getattr(self, k) != v}
        if wrong:
            raise ValueError(
                f"invalid LlamaConfig: norm {self.norm!r} needs "
                + ", ".join(f"{k}={v!r} (got {getattr(self, k)!r})" for k, v in wrong.items())
            )
        if scheme.owns_attention_norms and self.qk_norm:
            raise ValueError(
                f"invalid LlamaConfig: norm {self.norm!r} sets its own attention norms; qk_norm must be false, "
                f"got {self.qk_norm!r}"
            )

    @property
    def qk_norm_layout(self) -> str | None:
        """``"head"``, ``"full"`` or None: the QK-norm this config asks for (``true`` read as ``"head"``)."""
        return self.qk_norm or None

    def norm_scheme(self) -> NormScheme:
        """The norm scheme instance this config holds, resolved from ``norm``/``norm_args`` when it was built
        (its hyperparameters are read from this instance, never from the scheme's signature)."""
        return self._scheme

    def bind(self, **facts: Any) -> LlamaConfig:
        """This config with its norm scheme's run facts set (``NormScheme.bind``, e.g. ``seq_len=T``); entry
        points call ``bhyt_pl.run_config.build_run_config``, which binds through this.

        A copy whose ``norm_args`` carry the bound values, so a checkpoint records the facts its model
        was trained with; ``self`` when nothing changes. Facts the scheme does not declare are ignored.

        Example:
            >>> LlamaConfig.from_name("tiny", norm="bhyt").bind(seq_len=256).norm_args
            {'seq_len': 256}
            >>> LlamaConfig.from_name("tiny").bind(seq_len=256).norm_args
            {}
        """
        bound = self._scheme.bind(**facts)
        changed = {
            k: getattr(bound, k)
            for k in bound.run_facts
            if getattr(bound, k) is not None and self.norm_args.get(k) != getattr(bound, k)
        }
        if not changed:
            return self
        config = copy.copy(self)  # already validated: only the norm arguments and the bound instance change
        config.norm_args = {**self.norm_args, **changed}
        config.rope_scaling = dict(self.rope_scaling) if self.rope_scaling is not None else None
        config._scheme = bound
        return config

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> LlamaConfig:
        """A preset by name, with any field overridden.

        Example:
            >>> LlamaConfig.from_name("tiny", n_layers=2, norm="bhyt").n_layers
            2
        """
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = set(overrides) - set(fields)
        if unknown:
            raise ValueError(f"unknown LlamaConfig field(s) {sorted(unknown)}; fields: {', '.join(fields)}")
        from bhyt_pl.norms.base import scheme_class

        preset = PRESETS[name]
        norm = overrides.get("norm", preset.get("norm", "rmsnorm"))
        settings = scheme_class(norm).model_settings  # nGPT: untied; a class declaration, nothing is resolved
        return cls(**{**preset, "name": name, **settings, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _rope_scaling_problems(scaling: Any) -> list[str]:
    """What is wrong with a ``rope_scaling`` value (empty when it is valid)."""
    if not isinstance(scaling, dict):
        return [f"rope_scaling must be a mapping with keys {', '.join(ROPE_SCALING_KEYS)} or None, got {scaling!r}"]
    problems = []
    missing = [k for k in ROPE_SCALING_KEYS if k not in scaling]
    unknown = sorted(set(scaling) - set(ROPE_SCALING_KEYS))
    if missing or unknown:
        problems.append(
            f"rope_scaling needs exactly the keys {', '.join(ROPE_SCALING_KEYS)}; missing {missing}, unknown {unknown}"
        )
    if scaling.get("rope_type", "llama3") != "llama3":
        problems.append(
            f"rope_scaling.rope_type must be 'llama3' (the only scaling implemented), got {scaling['rope_type']!r}"
        )
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        value = scaling.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            problems.append(f"rope_scaling.{key} must be a number > 0, got {value!r}")
    low, high = scaling.get("low_freq_factor"), scaling.get("high_freq_factor")
    if not problems and not high > low:
        problems.append(f"rope_scaling.high_freq_factor ({high}) must be greater than low_freq_factor ({low})")
    return problems


_LLAMA32 = {
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "rope_scaling": LLAMA3_ROPE_SCALING,
    "tie_embeddings": True,
    "max_seq_len": 2048,
}

PRESETS: dict[str, dict[str, Any]] = {
    # paper models (docs/method.md, section 5)
    "llama-374m": {
        **_LLAMA32,
        "dim": 1024,
        "n_layers": 16,
        "n_heads": 16,
        "n_kv_heads": 4,
        "head_dim": 64,
        "mlp_dim": 4096,
    },
    "llama-1b": {
        **_LLAMA32,
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "head_dim": 64,
        "mlp_dim": 8192,
    },
    "llama-3b": {
        **_LLAMA32,
        "dim": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "head_dim": 128,
        "mlp_dim": 8192,
    },
    # CPU presets for the embedded 8k-vocabulary tokenizer
    "tiny": {
        "vocab_size": 8192,
        "dim": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "mlp_dim": 384,
        "max_seq_len": 512,
    },
    "small": {
        "vocab_size": 8192,
        "dim": 256,
        "n_layers": 8,
        "n_heads": 8,
        "n_kv_heads": 4,
        "mlp_dim": 768,
        "max_seq_len": 1024,
    },
    # deep and narrow, for depth studies (P of each: bhyt_pl.model_size)
    "deep-16x64": {
        "vocab_size": 8192,
        "dim": 64,
        "n_layers": 16,
        "n_heads": 2,
        "n_kv_heads": 1,
        "head_dim": 32,
        "mlp_dim": 192,
        "max_seq_len": 512,
    },
    "deep-24x128": {
        "vocab_size": 8192,
        "dim": 128,
        "n_layers": 24,
        "n_heads": 4,
        "n_kv_heads": 2,
        "mlp_dim": 384,
        "max_seq_len": 512,
    },
    "deep-32x128": {
        "vocab_size": 8192,
        "dim": 128,
        "n_layers": 32,
        "n_heads": 4,
        "n_kv_heads": 2,
        "mlp_dim": 384,
        "max_seq_len": 512,
    },
}

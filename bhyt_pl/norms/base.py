"""The norm-scheme registry and the per-block norms interface every scheme implements.

A *scheme* (``NormScheme``) is plain configuration with typed constructor arguments; it builds
modules for one model: a ``BlockNorms`` per layer (six sites: ``attn_in``, ``attn_out``,
``attn_res``, ``mlp_in``, ``mlp_out``, ``mlp_res``, and the two residual updates), the norms inside
attention (``AttentionNorms``: q, k, v and the softmax scale), the final norm and the embedding norm.
The model calls only these methods, so it never branches on a scheme's name, and statistics can flow
from site A to site B of a block through the ``ctx`` value (BHyT's one reduction per block).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from bhyt_pl.norms.rms import RMSNorm, second_moment
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "QK_NORMS",
    "AttentionNorms",
    "BlockNorms",
    "MLPScales",
    "Scale",
    "BoundedSite",
    "NormScheme",
    "build_norm_scheme",
    "check_norm_args",
    "registered_norms",
    "register_norm",
    "scheme_class",
    "second_moment",
]

_REGISTRY: dict[str, type[NormScheme]] = {}

QK_NORMS: tuple[str, ...] = ("head", "full")
"""Layouts of ``LlamaConfig.qk_norm``: ``head`` normalises each head's query and key over ``hd`` (one
gain ``[hd]`` shared by the heads); ``full`` normalises the whole projected q and k before the head
split (OLMo 2, gains ``[H * hd]`` and ``[K * hd]``). Both act before RoPE."""

S = TypeVar("S", bound="type[NormScheme]")


def register_norm(name: str) -> Callable[[S], S]:
    """Class decorator that registers a ``NormScheme`` subclass under ``name``.

    Example:
        >>> from bhyt_pl.norms import NormScheme, RMSNormScheme, register_norm
        >>> @register_norm("my_rms")
        ... class MyRMS(RMSNormScheme):
        ...     pass
        >>> build_norm_scheme("my_rms").name
        'my_rms'
    """

    def decorator(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, NormScheme)):
            raise TypeError(f"@register_norm({name!r}) expects a NormScheme subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"norm name {name!r} is already registered to {existing.__module__}.{existing.__qualname__}"
            )
        params = _constructor_parameters(cls)
        bad = [f for f in cls.run_facts if f not in params or params[f].default is not None]
        if bad:
            raise TypeError(
                f"@register_norm({name!r}): run_facts {bad} must be constructor arguments that default to None "
                "(unbound until a run binds them)"
            )
        undeclared = sorted(set(cls.run_fact_fallbacks) - set(cls.run_facts))
        if undeclared:
            raise TypeError(
                f"@register_norm({name!r}): run_fact_fallbacks {undeclared} are not among its run_facts "
                f"{list(cls.run_facts)}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_norms() -> list[str]:
    """Names accepted by ``build_norm_scheme``, sorted."""
    return sorted(_REGISTRY)


def scheme_class(norm: str | NormScheme) -> type[NormScheme]:
    """The class a registry name (or a ready scheme) stands for, without building it: its class-level
    declarations (``model_settings``, ``run_facts``) are read before a config exists."""
    if isinstance(norm, NormScheme):
        return type(norm)
    if not isinstance(norm, str):
        raise TypeError(f"norm must be a registry name (str) or a NormScheme, got {type(norm).__name__}")
    if norm not in _REGISTRY:
        raise ValueError(f"unknown norm {norm!r}; registered norms: {', '.join(registered_norms())}")
    return _REGISTRY[norm]


def build_norm_scheme(norm: str | NormScheme, **kwargs: Any) -> NormScheme:
    """Resolve a registry name (plus constructor kwargs) or pass a ready scheme through."""
    cls = scheme_class(norm)
    if isinstance(norm, NormScheme):
        if kwargs:
            raise TypeError("build_norm_scheme: keyword arguments are only accepted with a registry name")
        return norm
    check_norm_args(cls, kwargs)
    return cls(**kwargs)


def check_norm_args(scheme: type[NormScheme], kwargs: dict[str, Any]) -> None:
    """Raise a ``TypeError`` naming each unknown argument of ``scheme`` (with the accepted ones), or
    each argument whose value does not match its annotation.

    Hand-written rather than a type-checking library: scheme arguments are plain numbers, flags,
    strings and their optionals, and the check must name the scheme's field the way a recipe spells it."""
    import typing

    params = {n: p for n, p in _constructor_parameters(scheme).items() if n != "self"}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:  # a TypeError, as Python's own for an unexpected keyword argument
        raise TypeError(
            f"norm {scheme.name!r} has no argument(s) {', '.join(map(repr, unknown))}; "
            f"its arguments: {', '.join(params) or '(none)'}"
        )
    try:
        hints = typing.get_type_hints(scheme.__init__)
    except (NameError, TypeError):  # an annotation only importable for type checkers: the scheme checks itself
        return
    wrong = [
        f"{name}={value!r} ({type(value).__name__}) is not {_type_name(hints[name])}"
        for name, value in kwargs.items()
        if name in hints and not _matches(value, hints[name])
    ]
    if wrong:
        raise TypeError(f"norm {scheme.name!r} argument(s) of the wrong type: {'; '.join(wrong)}")


@functools.cache
def _constructor_parameters(cls: type) -> Mapping[str, inspect.Parameter]:
    """A scheme class's constructor parameters, read once per class (the one place a signature is read)."""
    return inspect.signature(cls.__init__).parameters


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits ``hint`` (numbers: an int is a float, a bool is neither); unknown hints pass."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


class BlockNorms(nn.Module):
    """The norm sites of one transformer block.

    The block computes::

        u, ctx = norms.pre_attn(x)
        h = norms.attn_residual(norms.attn_update(x, norms.post_attn(attn(u))))
        v = norms.pre_mlp(h, ctx)
        y = norms.mlp_residual(norms.mlp_update(h, norms.post_mlp(mlp(v))))

    Every site is a real submodule (``nn.Identity`` where a scheme has none), so hooks and
    state-dict keys have stable names such as ``layers.3.norms.attn_in``. ``attn_res`` and
    ``mlp_res`` act on the residual stream after each add (Post-LN, Mix-LN); identities have no
    parameters, so a scheme that leaves them out keeps its state-dict keys. Subclasses override
    ``pre_attn``/``pre_mlp`` to share statistics between the sites (``ctx``), and
    ``refresh_constants`` to recompute cached, weight-derived constants (with ``constants`` and
    ``set_constants``, through which a training checkpoint carries the values in use).
    """

    def __init__(
        self,
        attn_in: nn.Module,
        mlp_in: nn.Module,
        attn_out: nn.Module | None = None,
        mlp_out: nn.Module | None = None,
        attn_res: nn.Module | None = None,
        mlp_res: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn_in = attn_in
        self.attn_out = attn_out if attn_out is not None else nn.Identity()
        self.attn_res = attn_res if attn_res is not None else nn.Identity()
        self.mlp_in = mlp_in
        self.mlp_out = mlp_out if mlp_out is not None else nn.Identity()
        self.mlp_res = mlp_res if mlp_res is not None else nn.Identity()

    def pre_attn(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Site A. Returns the attention input and a context handed to ``pre_mlp``."""
        return self.attn_in(x), None

    def post_attn(self, a: torch.Tensor) -> torch.Tensor:
        """Applied to the attention output before the residual add (Peri-LN)."""
        return self.attn_out(a)

    def attn_update(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The residual update of the attention sublayer from the stream ``x`` and the branch output
        ``a``: the plain add ``x + a`` unless a scheme moves the stream otherwise."""
        return x + a

    def attn_residual(self, h: torch.Tensor) -> torch.Tensor:
        """Applied to the residual stream right after the attention add (Post-LN)."""
        return self.attn_res(h)

    def pre_mlp(self, h: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Site B. ``ctx`` is what ``pre_attn`` returned for the same block."""
        return self.mlp_in(h)

    def post_mlp(self, m: torch.Tensor) -> torch.Tensor:
        """Applied to the MLP output before the residual add (Peri-LN)."""
        return self.mlp_out(m)

    def mlp_update(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The residual update of the MLP sublayer (``h + m`` unless a scheme says otherwise)."""
        return h + m

    def mlp_residual(self, y: torch.Tensor) -> torch.Tensor:
        """Applied to the residual stream right after the MLP add, i.e. the block output (Post-LN)."""
        return self.mlp_res(y)

    def refresh_constants(self, attn: nn.Module) -> None:
        """Recompute cached constants derived from this block's attention weights (no-op by default)."""

    def constants(self) -> dict[str, torch.Tensor]:
        """The cached constants ``refresh_constants`` keeps, by name (none by default): the values in use, which a
        checkpoint stores so that a resume continues with them instead of recomputing them from newer weights."""
        return {}

    def set_constants(self, constants: Mapping[str, torch.Tensor]) -> None:
        """Put back values ``constants()`` returned (a checkpoint's) instead of recomputing them."""
        if constants:
            raise ValueError(f"{type(self).__name__} caches no constants; got {sorted(constants)}")

    def site_statistics(
        self, site: str, args: tuple[Any, ...], saturation_threshold: float = 2.0
    ) -> dict[str, tuple[torch.Tensor, float | torch.Tensor]]:
        """Named diagnostics of site ``site`` for the inputs ``args`` its forward receives, as
        ``{"<stat>/<site>" or "<stat>": (sum, count)}``; the mean of a statistic is ``sum / count``, so
        sums from several passes and ranks reduce exactly.

        By default, for a site built on a saturating function (``BoundedSite``): ``saturation/<site>``,
        the fraction of arguments with ``|arg| > saturation_threshold`` per token, summed over tokens, and
        each of its one-element parameters (``lambda/<site>``, ``alpha/<site>``; count 1). Schemes add
        their own (BHyT: the moment ratios of its approximated site B). Tools such as ``DepthStatsMonitor``
        read only this, never a site's attributes, so a new scheme's statistics need no tool edit."""
        module = getattr(self, site)
        if not isinstance(module, BoundedSite):
            return {}
        n = args[0].flatten(0, -2).shape[0]  # tokens
        z = module.preactivation(*args).flatten(0, -2)  # [N, d], or [N, 1] for a per-token argument
        saturated = (z.abs() > saturation_threshold).float().mean(dim=-1)  # [N]
        out: dict[str, tuple[torch.Tensor, float | torch.Tensor]] = {f"saturation/{site}": (saturated.sum(), n)}
        for key, value in module.scalars().items():
            out[f"{key}/{site}"] = (value.detach().reshape(()), 1)
        return out

    def reset_parameters(self) -> None:
        for site in (self.attn_in, self.attn_out, self.attn_res, self.mlp_in, self.mlp_out, self.mlp_res):
            if hasattr(site, "reset_parameters"):
                site.reset_parameters()


@dataclass(frozen=True)
class Scale:
    """A learnable per-channel multiplier a scheme adds to a projection or to the logits (nGPT's ``s_q``).

    The owning module stores ``name`` (a ``[width]`` parameter initialised to ``init``) and multiplies by
    ``stored * factor``: the stored value and its learning rate stay small while the effective scale is
    ``init * factor`` at the start.
    """

    name: str
    width: int
    init: float
    factor: float = 1.0


@dataclass
class MLPScales:
    """Scales of the SwiGLU's two input projections: ``down((up(h) * s_up) * silu(gate(h) * s_gate))``."""

    up: Scale | None = None
    gate: Scale | None = None


@dataclass
class AttentionNorms:
    """What a scheme puts inside one attention layer.

    ``q``, ``k`` and ``v`` become the attention's ``q_norm``, ``k_norm`` and ``v_norm`` submodules
    (``nn.Identity`` where there is none, so state-dict keys read ``attn.q_norm.weight``). With
    ``layout="head"`` they act on each head's vector [..., hd] after the head split; with ``"full"`` on
    the whole projection [..., H * hd] before it. Either way before RoPE. ``softmax_scale`` is the
    attention's score scale; None keeps ``scaled_dot_product_attention``'s ``1/sqrt(hd)``.
    """

    q: nn.Module
    k: nn.Module
    v: nn.Module
    layout: str = "head"
    softmax_scale: float | None = None
    q_scale: Scale | None = None
    """Multiplies the normalised query projection [..., H * hd] before the head split (``layout="full"``)."""
    k_scale: Scale | None = None
    """Multiplies the normalised key projection [..., K * hd] before the head split (``layout="full"``)."""

    def __post_init__(self) -> None:
        if self.layout not in QK_NORMS:
            raise ValueError(f"AttentionNorms.layout must be one of {', '.join(QK_NORMS)}; got {self.layout!r}")
        if (self.q_scale or self.k_scale) and self.layout != "full":
            raise ValueError("AttentionNorms: q_scale and k_scale act on the whole projection; they need layout='full'")

    def scale(self, head_dim: int) -> float:
        """The score scale the attention actually applies."""
        return 1.0 / math.sqrt(head_dim) if self.softmax_scale is None else self.softmax_scale


@runtime_checkable
class BoundedSite(Protocol):
    """What a norm site built on a saturating nonlinearity (tanh, erf, ISRU) tells diagnostics.

    Tools such as ``DepthStatsMonitor`` ask a site through this interface instead of reading its
    attributes by name, so a new scheme gets saturation and scalar statistics without tool edits.
    """

    def preactivation(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        """The argument of the bounded function for the site input ``x`` (float32 or wider), as the
        forward computes it; ``|argument|`` far above 1 means the function is saturated there."""
        ...

    def scalars(self) -> dict[str, torch.Tensor]:
        """The site's learnable one-element parameters by diagnostic name (``{"alpha": ...}``)."""
        ...


class NormScheme:
    """Base class of a registered normalization scheme.

    Subclasses take their hyperparameters as typed constructor arguments, store each under an
    attribute of the same name (so ``hparams()`` can rebuild them from the instance) and validate them in
    ``__init__`` through ``_raise_if``. They implement ``block_norms``, and override
    ``final_norm``/``embedding_norm`` where they differ from the defaults. Arguments that are facts
    about the training run (BHyT's ``seq_len``) are listed in ``run_facts``, default to ``None`` and
    are set by the entry points through ``bind``.
    """

    name: str = "<unregistered>"
    needs_constant_refresh: bool = False
    """True when ``BlockNorms.refresh_constants`` caches weight-derived values that go stale as the
    weights train (BHyT's ``c``); training then adds the refresh callback automatically."""
    run_facts: ClassVar[tuple[str, ...]] = ()
    """Constructor arguments that are facts about the training run rather than choices (BHyT's
    ``seq_len``, the ``T`` of its constant ``c``). Each one defaults to ``None`` until bound. Declaring a
    fact here is all a scheme does: every entry point (CLI, ``LlamaLM``, fine-tuning, study, bench,
    scripts) builds its config with ``bhyt_pl.run_config.build_run_config`` and passes every fact it knows
    about its run (the data module's ``run_facts()``: ``seq_len``, ``batch_size``); the scheme takes the ones it
    declares (docs/method.md, section 9). There is no central list of facts."""
    run_fact_fallbacks: ClassVar[dict[str, Any]] = {}
    """The value a declared run fact takes while no run has bound it (BHyT: ``seq_len`` 1024, the paper's
    pretraining length): the warning about an unbound fact names it, and a model built unbound records it
    (``LlamaLM`` binds it into its config, so ``hparams.yaml`` and checkpoints say what the model was built with)."""

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        """Build the norms of block ``layer_idx`` (0-based) of ``n_layers``, width ``dim``."""
        raise NotImplementedError

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        """The norm after the last block (RMSNorm unless a scheme says otherwise)."""
        return RMSNorm(dim, eps=1e-5)

    def embedding_norm(self, dim: int) -> nn.Module:
        """Applied to the token embeddings before the first block (identity by default)."""
        return nn.Identity()

    model_settings: ClassVar[dict[str, Any]] = {}
    """``LlamaConfig`` fields the scheme needs (nGPT: ``{"tie_embeddings": False}``): ``LlamaConfig.from_name``
    applies them over the preset (below the caller's overrides) and a config that contradicts one is refused."""
    training_defaults: ClassVar[dict[str, Any]] = {}
    """Optimisation the scheme's recipe uses (nGPT: no weight decay, no warmup), by ``LlamaLM`` argument name;
    ``fit`` and ``study`` (through ``LlamaLM``) apply them where the user sets nothing and say so in the log;
    ``bench``'s step timings use their own fixed optimizer."""

    def mlp_scales(self, dim: int, mlp_dim: int) -> MLPScales:
        """Scales of the MLP's input projections (none by default: the plain SwiGLU)."""
        return MLPScales()

    def logit_scale(self, dim: int, vocab_size: int) -> Scale | None:
        """A scale of the logits, applied by ``Llama.output`` and by the chunked loss alike (None by default)."""
        return None

    def constrain_weights(self, matrices: list[tuple[torch.Tensor, int]], *, keep_satisfied: bool = False) -> None:
        """Project weights back onto the scheme's constraint set, in place, under ``torch.no_grad``.

        ``matrices`` is every weight matrix of the model with the dimension that runs along the model width
        ``d`` (``Llama.width_matrices``); the model calls this after initialisation, after loading weights and
        after every optimizer step. With ``keep_satisfied`` (after loading weights) a scheme leaves weights
        that already satisfy its constraint up to rounding untouched, so a resumed run is bit-identical to
        the uninterrupted one. A no-op by default. Weights may be FSDP2 ``DTensor`` shards: reductions
        over a sharded dimension must go through DTensor ops (which reduce across ranks), not local tensors.
        """

    owns_attention_norms: ClassVar[bool] = False
    """True when the scheme sets the q/k/v norms itself (``attention_norms`` ignores ``qk_norm``); the
    config then refuses any ``qk_norm`` setting instead of silently dropping it."""

    def attention_norms(
        self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, qk_norm: str | None, qk_norm_eps: float
    ) -> AttentionNorms:
        """The norms inside one attention layer. By default ``LlamaConfig.qk_norm`` decides: none,
        per-head RMSNorms (``"head"``, gains ``[hd]``) or OLMo 2's full-width ones (``"full"``)."""
        if qk_norm is None:
            return AttentionNorms(nn.Identity(), nn.Identity(), nn.Identity())
        if qk_norm == "head":
            q, k = RMSNorm(head_dim, qk_norm_eps), RMSNorm(head_dim, qk_norm_eps)
        else:
            q, k = RMSNorm(n_heads * head_dim, qk_norm_eps), RMSNorm(n_kv_heads * head_dim, qk_norm_eps)
        return AttentionNorms(q, k, nn.Identity(), layout=qk_norm)

    def diagnostics(self, n_layers: int, blocks: Sequence[BlockNorms] = ()) -> dict[str, Any]:
        """The scheme's named model-level statistics for a model of ``n_layers`` whose block norms are
        ``blocks`` (first to last; empty: only what the configuration tells). Empty by default; BHyT
        reports ``variance_bound``, its theorem condition at the initial and the learned lambdas. The
        study reads only this, never the scheme's hyperparameters by name."""
        return {}

    def bind(self, **facts: Any) -> NormScheme:
        """This scheme with its declared ``run_facts`` set from ``facts``: a new scheme when any value
        changes, else ``self``. Facts the scheme does not declare, and ``None`` values, are ignored, so an
        entry point passes everything it knows about its run (``scheme.bind(seq_len=T)``) whatever the scheme.

        Example:
            >>> build_norm_scheme("bhyt").bind(seq_len=256).seq_len
            256
            >>> build_norm_scheme("rmsnorm").bind(seq_len=256)
            RMSNormScheme(eps=1e-05, impl='auto')
        """
        values = {k: facts[k] for k in self.run_facts if facts.get(k) is not None}
        if all(getattr(self, k) == v for k, v in values.items()):
            return self
        return type(self)(**{**self.hparams(), **values})

    def unbound_run_facts(self) -> list[str]:
        """The declared run facts still ``None`` (the scheme then uses its documented fallback)."""
        return [k for k in self.run_facts if getattr(self, k) is None]

    def fallback_run_facts(self) -> dict[str, Any]:
        """The unbound run facts that have a declared fallback (``run_fact_fallbacks``), with the value the
        scheme uses for each.

        Example:
            >>> build_norm_scheme("bhyt").fallback_run_facts()
            {'seq_len': 1024}
            >>> build_norm_scheme("bhyt", seq_len=256).fallback_run_facts()
            {}
        """
        return {k: self.run_fact_fallbacks[k] for k in self.unbound_run_facts() if k in self.run_fact_fallbacks}

    @classmethod
    def export_source(cls) -> str | None:
        """Python source of the module that defines this scheme, shipped with exported models
        (``bhyt_pl.convert.save_hf``), or None when the scheme cannot be exported.

        bhyt_pl's own schemes are exported from the package's source and never asked. A scheme of your
        own returns its module's source, e.g. ``inspect.getsource(sys.modules[cls.__module__])``: its
        imports of ``bhyt_pl`` are resolved into the exported file, its other imports are kept.
        """
        return None

    def hparams(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this scheme: ``type(s)(**s.hparams())``."""
        params = _constructor_parameters(type(self))
        return {n: getattr(self, n) for n, p in params.items() if n != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.hparams() == other.hparams()  # type: ignore[union-attr]

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(self.hparams().items()))))

    def _raise_if(self, problems: list[str]) -> None:
        """Raise one ValueError listing every invalid field (collect, then raise once)."""
        raise_if_problems(f"{self.name!r} norm configuration", problems)

"""The norm-scheme registry and the per-block norms interface every scheme implements.

A *scheme* (``NormScheme``) is plain configuration with typed constructor arguments; it builds
modules for one model: a ``BlockNorms`` per layer (six sites: ``attn_in``, ``attn_out``,
``attn_res``, ``mlp_in``, ``mlp_out``, ``mlp_res``), the final norm and the embedding norm. The block calls only
``BlockNorms`` methods, so it never branches on a scheme's name, and statistics can flow from
site A to site B of a block through the ``ctx`` value (BHyT's one reduction per block).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from bhyt_pl.validation import raise_if_problems

__all__ = [
    "RUN_FACTS",
    "BlockNorms",
    "BoundedSite",
    "NormScheme",
    "build_norm_scheme",
    "check_norm_args",
    "registered_norms",
    "register_norm",
    "second_moment",
]

_REGISTRY: dict[str, type[NormScheme]] = {}

RUN_FACTS: tuple[str, ...] = ("seq_len",)
"""Every fact about a run an entry point can bind into a scheme (``NormScheme.bind``):
``seq_len``, the training sequence length ``T`` of the run that trains the model."""

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
        params = inspect.signature(cls.__init__).parameters
        bad = [f for f in cls.run_facts if f not in RUN_FACTS or f not in params]
        if bad:
            raise TypeError(
                f"@register_norm({name!r}): run_facts {bad} must be constructor arguments named among {RUN_FACTS}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def registered_norms() -> list[str]:
    """Names accepted by ``build_norm_scheme``, sorted."""
    return sorted(_REGISTRY)


def build_norm_scheme(norm: str | NormScheme, **kwargs: Any) -> NormScheme:
    """Resolve a registry name (plus constructor kwargs) or pass a ready scheme through."""
    if isinstance(norm, NormScheme):
        if kwargs:
            raise TypeError("build_norm_scheme: keyword arguments are only accepted with a registry name")
        return norm
    if not isinstance(norm, str):
        raise TypeError(f"norm must be a registry name (str) or a NormScheme, got {type(norm).__name__}")
    if norm not in _REGISTRY:
        raise ValueError(f"unknown norm {norm!r}; registered norms: {', '.join(registered_norms())}")
    check_norm_args(_REGISTRY[norm], kwargs)
    return _REGISTRY[norm](**kwargs)


def check_norm_args(scheme: type[NormScheme], kwargs: dict[str, Any]) -> None:
    """Raise a ``TypeError`` naming each unknown argument of ``scheme`` (with the accepted ones), or
    each argument whose value does not match its annotation.

    Hand-written rather than a type-checking library: scheme arguments are plain numbers, flags,
    strings and their optionals, and the check must name the scheme's field the way a recipe spells it."""
    import typing

    params = {n: p for n, p in inspect.signature(scheme.__init__).parameters.items() if n != "self"}
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


def second_moment(x: torch.Tensor) -> torch.Tensor:
    """Per-token uncentered second moment ``mean(x^2)`` over the last dim, at least float32. Shape [..., 1]."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return x.to(dtype).pow(2).mean(dim=-1, keepdim=True)


class BlockNorms(nn.Module):
    """The norm sites of one transformer block.

    The block computes::

        u, ctx = norms.pre_attn(x)
        h = norms.attn_residual(x + norms.post_attn(attn(u)))
        v = norms.pre_mlp(h, ctx)
        y = norms.mlp_residual(h + norms.post_mlp(mlp(v)))

    Every site is a real submodule (``nn.Identity`` where a scheme has none), so hooks and
    state-dict keys have stable names such as ``layers.3.norms.attn_in``. ``attn_res`` and
    ``mlp_res`` act on the residual stream after each add (Post-LN, Mix-LN); identities have no
    parameters, so a scheme that leaves them out keeps its state-dict keys. Subclasses override
    ``pre_attn``/``pre_mlp`` to share statistics between the sites (``ctx``), and
    ``refresh_constants`` to recompute cached, weight-derived constants.
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

    def attn_residual(self, h: torch.Tensor) -> torch.Tensor:
        """Applied to the residual stream right after the attention add (Post-LN)."""
        return self.attn_res(h)

    def pre_mlp(self, h: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Site B. ``ctx`` is what ``pre_attn`` returned for the same block."""
        return self.mlp_in(h)

    def post_mlp(self, m: torch.Tensor) -> torch.Tensor:
        """Applied to the MLP output before the residual add (Peri-LN)."""
        return self.mlp_out(m)

    def mlp_residual(self, y: torch.Tensor) -> torch.Tensor:
        """Applied to the residual stream right after the MLP add, i.e. the block output (Post-LN)."""
        return self.mlp_res(y)

    def refresh_constants(self, attn: nn.Module) -> None:
        """Recompute cached constants derived from this block's attention weights (no-op by default)."""

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
    attribute of the same name (so ``hparams()`` can rebuild them) and validate them in
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
    ``seq_len``, the ``T`` of its constant ``c``). Each one is ``None`` until bound; every entry point
    (CLI, ``LlamaLM``, study, bench, scripts, fine-tuning) supplies them through ``bind`` and never
    inspects constructor signatures (docs/method.md, section 9)."""

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        """Build the norms of block ``layer_idx`` (0-based) of ``n_layers``, width ``dim``."""
        raise NotImplementedError

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        """The norm after the last block (RMSNorm unless a scheme says otherwise)."""
        from bhyt_pl.norms.rmsnorm import RMSNorm

        return RMSNorm(dim, eps=1e-5)

    def embedding_norm(self, dim: int) -> nn.Module:
        """Applied to the token embeddings before the first block (identity by default)."""
        return nn.Identity()

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
            RMSNormScheme(eps=1e-05)
        """
        unknown = sorted(set(facts) - set(RUN_FACTS))
        if unknown:
            raise TypeError(f"unknown run fact(s) {unknown}; run facts: {', '.join(RUN_FACTS)}")
        values = {k: facts[k] for k in self.run_facts if facts.get(k) is not None}
        if all(getattr(self, k) == v for k, v in values.items()):
            return self
        return type(self)(**{**self.hparams(), **values})

    def unbound_run_facts(self) -> list[str]:
        """The declared run facts still ``None`` (the scheme then uses its documented fallback)."""
        return [k for k in self.run_facts if getattr(self, k) is None]

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
        params = inspect.signature(type(self).__init__).parameters
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

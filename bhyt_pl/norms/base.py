"""The norm-scheme registry and the per-block norms interface every scheme implements.

A *scheme* (``NormScheme``) is plain configuration with typed constructor arguments; it builds
modules for one model: a ``BlockNorms`` per layer (four sites: ``attn_in``, ``attn_out``,
``mlp_in``, ``mlp_out``), the final norm and the embedding norm. The block calls only
``BlockNorms`` methods, so it never branches on a scheme's name, and statistics can flow from
site A to site B of a block through the ``ctx`` value (BHyT's one reduction per block).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = [
    "BlockNorms",
    "NormScheme",
    "build_norm_scheme",
    "registered_norms",
    "register_norm",
    "second_moment",
]

_REGISTRY: dict[str, type[NormScheme]] = {}

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
    return _REGISTRY[norm](**kwargs)


def second_moment(x: torch.Tensor) -> torch.Tensor:
    """Per-token uncentered second moment ``mean(x^2)`` over the last dim, at least float32. Shape [..., 1]."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return x.to(dtype).pow(2).mean(dim=-1, keepdim=True)


class BlockNorms(nn.Module):
    """The norm sites of one transformer block.

    The block computes::

        u, ctx = norms.pre_attn(x)
        h = x + norms.post_attn(attn(u))
        v = norms.pre_mlp(h, ctx)
        y = h + norms.post_mlp(mlp(v))

    Every site is a real submodule (``nn.Identity`` where a scheme has none), so hooks and
    state-dict keys have stable names such as ``layers.3.norms.attn_in``. Subclasses override
    ``pre_attn``/``pre_mlp`` to share statistics between the sites (``ctx``), and
    ``refresh_constants`` to recompute cached, weight-derived constants.
    """

    def __init__(
        self,
        attn_in: nn.Module,
        mlp_in: nn.Module,
        attn_out: nn.Module | None = None,
        mlp_out: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn_in = attn_in
        self.attn_out = attn_out if attn_out is not None else nn.Identity()
        self.mlp_in = mlp_in
        self.mlp_out = mlp_out if mlp_out is not None else nn.Identity()

    def pre_attn(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Site A. Returns the attention input and a context handed to ``pre_mlp``."""
        return self.attn_in(x), None

    def post_attn(self, a: torch.Tensor) -> torch.Tensor:
        """Applied to the attention output before the residual add (Peri-LN)."""
        return self.attn_out(a)

    def pre_mlp(self, h: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Site B. ``ctx`` is what ``pre_attn`` returned for the same block."""
        return self.mlp_in(h)

    def post_mlp(self, m: torch.Tensor) -> torch.Tensor:
        """Applied to the MLP output before the residual add (Peri-LN)."""
        return self.mlp_out(m)

    def refresh_constants(self, attn: nn.Module) -> None:
        """Recompute cached constants derived from this block's attention weights (no-op by default)."""

    def reset_parameters(self) -> None:
        for site in (self.attn_in, self.attn_out, self.mlp_in, self.mlp_out):
            if hasattr(site, "reset_parameters"):
                site.reset_parameters()


class NormScheme:
    """Base class of a registered normalization scheme.

    Subclasses take their hyperparameters as typed constructor arguments, store each under an
    attribute of the same name (so ``hparams()`` can rebuild them) and validate them in
    ``__init__`` through ``_raise_if``. They implement ``block_norms``, and override
    ``final_norm``/``embedding_norm`` where they differ from the defaults.
    """

    name: str = "<unregistered>"
    needs_constant_refresh: bool = False
    """True when ``BlockNorms.refresh_constants`` caches weight-derived values that go stale as the
    weights train (BHyT's ``c``); training then adds the refresh callback automatically."""

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
        if problems:
            raise ValueError(f"invalid {self.name!r} norm configuration:\n  - " + "\n  - ".join(problems))

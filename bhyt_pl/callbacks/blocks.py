"""Finding the transformer blocks of any model, so the callbacks work inside anyone's LightningModule.

``locate_blocks(pl_module)`` searches the module tree, outermost first, for:

- bhyt_pl's ``Llama`` (``layers``; its blocks also expose their norm sites);
- a Hugging Face ``transformers`` decoder-only model: ``model.layers`` (Llama, Mistral, Qwen, Gemma,
  OLMo, Phi-3), ``model.decoder.layers`` (OPT), ``transformer.h`` (GPT-2, GPT-J, Falcon), ``gpt_neox.layers``,
  ``transformer.blocks`` (MPT);
- litgpt's ``GPT``: ``transformer.h``.

Anything else takes a ``blocks`` argument: a dotted path from the LightningModule (``"net.decoder.layers"``)
or a callable that returns the blocks. Statistics that need bhyt_pl's norm sites (saturation, lambda or
alpha, BHyT's moment ratio) exist only where ``LocatedBlocks.norm_sites`` is non-empty.

Example:
    >>> import torch
    >>> from bhyt_pl import Llama, LlamaConfig
    >>> located = locate_blocks(Llama(LlamaConfig.from_name("tiny", n_layers=2)))
    >>> len(located), located.path, located.has_norm_sites
    (2, 'layers', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from torch import nn

__all__ = ["BlocksSpec", "KNOWN_PATHS", "LocatedBlocks", "QKProjections", "locate_blocks"]

BlocksSpec = str | Callable[[nn.Module], Sequence[nn.Module]] | None
"""How callbacks take a ``blocks`` argument: None (find them), a dotted path, or a callable."""

KNOWN_PATHS = (
    "model.layers",
    "model.decoder.layers",
    "transformer.h",
    "gpt_neox.layers",
    "transformer.blocks",
)
"""Block-list paths, relative to a submodule, of the decoder-only families the locator knows."""

_ATTENTION_NAMES = ("attn", "self_attn", "attention", "self_attention")
_QUERY_NAMES, _KEY_NAMES = ("q_proj", "query", "wq"), ("k_proj", "key", "wk")


@dataclass(frozen=True)
class QKProjections:
    """The query and key projections of one attention module (``nn.Linear``-like, outputs [..., H*hd] and
    [..., K*hd]), with the head width to split them into heads."""

    q: nn.Module
    k: nn.Module
    head_dim: int

    @property
    def n_heads(self) -> int:
        return self.q.out_features // self.head_dim

    @property
    def n_kv_heads(self) -> int:
        return self.k.out_features // self.head_dim


@dataclass(frozen=True)
class LocatedBlocks:
    """The transformer blocks of a model, in depth order, and how they were found.

    Attributes:
        blocks: the block modules; a block's forward takes the residual stream as its first input
            (positional, or ``hidden_states``) and returns it (or a tuple starting with it).
        path: where they live, relative to the module searched (``"model.model.layers"``).
        owner: the module holding the list (bhyt_pl ``Llama``, a transformers model, litgpt ``GPT``).
    """

    blocks: tuple[nn.Module, ...]
    path: str
    owner: nn.Module

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self.blocks)

    def __getitem__(self, i: int) -> nn.Module:
        return self.blocks[i]

    def norm_sites(self, i: int) -> dict[str, nn.Module]:
        """bhyt_pl's norm sites of block ``i`` that do something (``{"attn_in": ..., "mlp_in": ...}``); empty
        for blocks of other models."""
        norms = self.block_norms(i)
        if norms is None:
            return {}
        return {name: site for name, site in norms.named_children() if not isinstance(site, nn.Identity)}

    def block_norms(self, i: int) -> nn.Module | None:
        """The ``BlockNorms`` of block ``i`` (bhyt_pl blocks only), else None."""
        from bhyt_pl.norms import BlockNorms

        norms = getattr(self.blocks[i], "norms", None)
        return norms if isinstance(norms, BlockNorms) else None

    @property
    def has_norm_sites(self) -> bool:
        return any(self.norm_sites(i) for i in range(len(self.blocks)))

    def attention(self, i: int) -> nn.Module | None:
        """The self-attention module of block ``i`` (``attn``, ``self_attn``, ``attention``), if any."""
        for name in _ATTENTION_NAMES:
            module = getattr(self.blocks[i], name, None)
            if isinstance(module, nn.Module):
                return module
        return None

    def qk_projections(self, i: int) -> QKProjections | None:
        """Block ``i``'s query and key projections where the attention has separate ones (bhyt_pl, transformers
        Llama-likes: ``q_proj``/``k_proj``); None for fused projections (litgpt's ``qkv``, GPT-2's ``c_attn``)."""
        attn = self.attention(i)
        if attn is None:
            return None
        q = next((m for n in _QUERY_NAMES if isinstance(m := getattr(attn, n, None), nn.Module)), None)
        k = next((m for n in _KEY_NAMES if isinstance(m := getattr(attn, n, None), nn.Module)), None)
        head_dim = getattr(attn, "head_dim", None)
        if q is None or k is None or not isinstance(head_dim, int) or not hasattr(q, "out_features"):
            return None
        return QKProjections(q, k, head_dim)


def _get_path(root: nn.Module, path: str) -> object:
    obj: object = root
    for part in path.split("."):
        obj = (
            obj[int(part)]
            if part.isdigit() and isinstance(obj, (nn.ModuleList, nn.Sequential))
            else getattr(obj, part, None)
        )
        if obj is None:
            return None
    return obj


def _as_blocks(value: object) -> tuple[nn.Module, ...] | None:
    if isinstance(value, (nn.ModuleList, nn.Sequential, list, tuple)) and len(value) > 0:
        blocks = tuple(value)
        if all(isinstance(b, nn.Module) for b in blocks):
            return blocks
    return None


def locate_blocks(module: nn.Module, blocks: BlocksSpec = None) -> LocatedBlocks:
    """The transformer blocks inside ``module`` (a LightningModule or any ``nn.Module``).

    Args:
        module: where to search.
        blocks: None to search (bhyt_pl ``Llama``, then ``KNOWN_PATHS`` on every submodule, outermost
            first), a dotted path from ``module`` (``"model.layers"``), or a callable ``module -> blocks``.

    Raises:
        ValueError: nothing found, or ``blocks`` does not lead to a non-empty sequence of modules.
        TypeError: ``blocks`` is neither None, a string nor a callable.
    """
    if isinstance(blocks, str):
        found = _as_blocks(_get_path(module, blocks))
        if found is None:
            raise ValueError(
                f"blocks={blocks!r} does not name a non-empty list of modules in {type(module).__name__}; "
                "give the dotted path of the transformer blocks (e.g. 'model.model.layers')"
            )
        return LocatedBlocks(found, blocks, module)
    if callable(blocks):
        found = _as_blocks(list(blocks(module)))
        if found is None:
            raise ValueError(f"the blocks callable {blocks!r} returned no modules for {type(module).__name__}")
        return LocatedBlocks(found, getattr(blocks, "__name__", "callable"), module)
    if blocks is not None:
        raise TypeError(f"blocks must be None, a dotted path or a callable, got {type(blocks).__name__}")

    from bhyt_pl.model import Llama

    named = list(module.named_modules())
    for name, sub in named:
        if isinstance(sub, Llama):
            return LocatedBlocks(tuple(sub.layers), f"{name}.layers" if name else "layers", sub)
    for name, sub in sorted(named, key=lambda item: item[0].count(".") + bool(item[0])):  # outermost first
        for path in KNOWN_PATHS:
            found = _as_blocks(_get_path(sub, path))
            if found is not None:
                return LocatedBlocks(found, f"{name}.{path}" if name else path, sub)
    raise ValueError(
        f"no transformer blocks found in {type(module).__name__} (looked for a bhyt_pl Llama and "
        f"{', '.join(KNOWN_PATHS)}); pass blocks='dotted.path.to.blocks' or a callable returning them"
    )

"""How big a model is, counted in one place: P, the parameters of the blocks' weight matrices; the embedding;
everything the built model holds; and a budget's tokens per parameter (docs/method.md, "Model size").

P is what scales with depth and width and what the training FLOPs count per layer (``bhyt_pl.flops`` adds the
output projection and attention to it): the embedding is a lookup, not a matmul, and the norms' gains are a
few thousand parameters beside millions. "Everything" is ``sum(p.numel() for p in model.parameters())`` of the
built ``Llama``: the norm parameters of its scheme included, a tied output projection counted once (it reads
the embedding's weight), an untied one (nGPT) counted as its own matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Llama

__all__ = [
    "ModelSize",
    "block_params",
    "embedding_params",
    "steps_for_tokens_per_param",
    "tokens_per_param",
    "total_params",
]


def block_params(config: LlamaConfig) -> int:
    """P: the weight matrices of the transformer blocks, ``L x (d x hd x (2 H + 2 K) + 3 x d x mlp_dim)`` (the
    q and o projections ``d x H hd``, k and v ``d x K hd``, SwiGLU's gate, up and down ``d x mlp_dim``); no
    norm parameter, no embedding, no output projection."""
    c = config
    attention = c.dim * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
    mlp = 3 * c.dim * c.mlp_dim
    return c.n_layers * (attention + mlp)


def embedding_params(config: LlamaConfig) -> int:
    """The embedding table, ``vocab_size x dim`` (a tied output projection reads the same matrix)."""
    return config.vocab_size * config.dim


def total_params(model: nn.Module) -> int:
    """Every parameter ``model`` holds, ``sum(p.numel() for p in model.parameters())``: ``parameters()`` yields a
    parameter shared by two modules once."""
    return sum(p.numel() for p in model.parameters())


def tokens_per_param(tokens: int, block_params: int) -> float:
    """T/P: training tokens per block-matrix parameter (``block_params``)."""
    if block_params <= 0:
        raise ValueError(f"block_params must be > 0, got {block_params}")
    return tokens / block_params


def steps_for_tokens_per_param(ratio: float, block_params: int, tokens_per_step: int) -> int:
    """The optimizer steps of a budget of ``ratio`` tokens per parameter: ``ratio x block_params /
    tokens_per_step`` rounded to the nearest whole step (halves up), at least 1. Nearest, not up: the run's T/P is
    then the closest a whole number of steps gets to ``ratio`` (off by at most half a step's tokens)."""
    if not ratio > 0:
        raise ValueError(f"tokens per parameter must be > 0, got {ratio}")
    if block_params <= 0 or tokens_per_step <= 0:
        raise ValueError(f"block_params and tokens_per_step must be > 0, got {block_params} and {tokens_per_step}")
    # floor(x + 0.5), not round(): Python's round goes to the even neighbour at a half (2.5 -> 2)
    return max(1, int(ratio * block_params / tokens_per_step + 0.5))


@dataclass(frozen=True)
class ModelSize:
    """The three counts of one model (module docstring).

    Args:
        block_params: P (``block_params``).
        embedding_params: the embedding table (``embedding_params``).
        total_params: everything the built model holds (``total_params``).
    """

    block_params: int
    embedding_params: int
    total_params: int

    @classmethod
    def of(cls, config: LlamaConfig, model: nn.Module | None = None) -> ModelSize:
        """The counts of ``config``; ``total_params`` from ``model`` when given, else from a ``Llama(config)`` built
        on the meta device (shapes only: no memory, no initialisation, no random numbers drawn)."""
        if model is None:
            with torch.device("meta"):
                model = Llama(config)
        return cls(block_params(config), embedding_params(config), total_params(model))

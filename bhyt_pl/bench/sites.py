"""The norm sites of one block alone, forward and backward, at a model's width.

One "block" of norm work is what ``Block.forward`` asks of its ``BlockNorms``: ``pre_attn`` on the
block input, ``post_attn`` on the attention output, ``attn_residual`` after the first residual add,
``pre_mlp`` on ``h`` (with site A's context), ``post_mlp`` on the MLP output and ``mlp_residual``
after the second add. The attention and the MLP are replaced by fixed tensors, so the time is the
norms' (two sites, four for Peri-LN) plus the two residual adds every scheme shares.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bhyt_pl.bench.variants import Variant
from bhyt_pl.norms import BlockNorms, build_norm_scheme

__all__ = ["block_norms", "site_step"]


def block_norms(
    variant: Variant, dim: int, n_layers: int, device: torch.device, dtype: torch.dtype, seq_len: int
) -> BlockNorms:
    """The norms of block 0 of ``n_layers`` for ``variant``, bound to the training length ``seq_len``;
    BHyT's cached ``c`` set to a typical 0.5 (there are no attention weights to derive it from)."""
    scheme = build_norm_scheme(variant.norm, **variant.norm_args).bind(seq_len=seq_len)
    norms = scheme.block_norms(dim, 0, n_layers)
    norms = norms.to(device=device, dtype=dtype)
    if hasattr(norms, "c"):
        with torch.no_grad():
            norms.c.fill_(0.5)  # a float32 buffer; any positive value exercises the correction
    return norms


def _forward(norms: BlockNorms, x: torch.Tensor, a: torch.Tensor, m: torch.Tensor):
    u, ctx = norms.pre_attn(x)  # site A: x [N, d]
    h = norms.attn_residual(x + norms.post_attn(a))  # a stands in for Attn(u)
    v = norms.pre_mlp(h, ctx)  # site B
    y = norms.mlp_residual(h + norms.post_mlp(m))  # m stands in for MLP(v)
    return u, v, y


def site_step(
    norms: BlockNorms, tokens: int, compile: bool, device: torch.device, dtype: torch.dtype, dim: int
) -> tuple[Callable[[], None], Callable[[], object]]:
    """``(step, forward)``: one forward+backward of the block's sites on [tokens, dim] inputs, and the
    forward alone (for the saved-activation count). Inputs are made once, outside the timing."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    make = lambda: torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype).requires_grad_()  # noqa: E731
    x, a, m = make(), make(), make()
    grads = [torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype) for _ in range(3)]
    fwd = torch.compile(_forward, dynamic=False) if compile else _forward

    def forward():
        return fwd(norms, x, a, m)

    def step() -> None:
        outs = forward()
        torch.autograd.backward(outs, grads)
        for t in (x, a, m, *norms.parameters()):
            t.grad = None

    return step, forward

"""The two pre-norm sites of one block, ``pre_attn`` then ``pre_mlp``, forward and backward.

This is the norm work that BHyT and RMSNorm both do in every block (no residual adds, no Peri-LN
output norms), the unit of the eager-cost goal "BHyT's sites at most 1.3x RMSNorm's" (``[4096, 2048]``
float32, one thread). Site B runs on ``h``, a second input, with site A's statistic, so BHyT's
approximated moment and its gradient path into ``x`` are timed as in a block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bhyt_pl.norms import BlockNorms

__all__ = ["prenorm_step"]


def prenorm_step(
    norms: BlockNorms, tokens: int, dim: int, device: torch.device, dtype: torch.dtype
) -> Callable[[], None]:
    """One forward+backward of ``norms.pre_attn(x)`` then ``norms.pre_mlp(h, ctx)`` on ``[tokens, dim]``
    inputs made once, outside the timing."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x, h, g_u, g_v = (torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    x.requires_grad_(True)
    h.requires_grad_(True)

    def step() -> None:
        u, ctx = norms.pre_attn(x)
        v = norms.pre_mlp(h, ctx)
        torch.autograd.backward([u, v], [g_u, g_v])
        for t in (x, h, *norms.parameters()):
            t.grad = None

    return step

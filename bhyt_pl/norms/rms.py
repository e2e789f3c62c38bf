"""The RMSNorm site (Pre-LN Llama): ``gamma * x * rsqrt(mean(x^2) + eps)`` with the statistic in float32.

Two implementations of the same function (``impl``): ``reference`` is plain autograd ops, which
is what ``torch.compile`` fuses best; ``fused`` is ``RMSNormFunction``, an autograd Function that
saves only the input and the per-token ``rstd`` and does its backward in six passes over the
activations, two of them matrix-vector products (eager autograd of the plain ops makes about
twice as many passes, and ``F.rms_norm`` is no faster on the CPU build). ``auto`` (default)
uses ``fused`` eager and ``reference`` while compiling. Measured by ``python -m bhyt_pl bench``
(docs/performance.md); gradients are tested against the reference in float64.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["IMPLS", "RMSNorm", "RMSNormFunction", "second_moment"]


def second_moment(x: torch.Tensor) -> torch.Tensor:
    """Per-token uncentered second moment ``mean(x^2)`` over the last dim, at least float32. Shape [..., 1]."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return x.to(dtype).pow(2).mean(dim=-1, keepdim=True)


IMPLS = ("auto", "reference", "fused")
"""How a norm site computes: ``reference`` (plain ops), ``fused`` (an autograd Function that saves only
the input and a per-token scale), ``auto`` (whichever the module found faster: RMSNorm fuses in eager
mode only, BHyT while compiling and, eager, on the CPU). One tuple for every site that has both paths."""


class RMSNormFunction(torch.autograd.Function):
    """``weight * (x * rstd).to(x.dtype)`` with ``rstd = rsqrt(mean(x^2) + eps)`` per token, in at least
    float32; saves ``x`` (its own dtype), ``rstd`` [..., 1] and ``weight``.

    Backward with ``xhat = x * rstd``, ``t = g * x`` (float32):
    ``d weight = sum_n rstd_n t_n`` (a matrix-vector product), ``d x = rstd (g * weight) - x rstd^3 (t . weight) / d``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(compute)
        # one read for the statistic: ||x||^2 / d, instead of pow then mean
        rstd = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, rstd, weight)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        compute = rstd.dtype
        d = x.shape[-1]
        xf = x.reshape(-1, d).to(compute)  # [N, d]
        g = grad.reshape(-1, d).to(compute)
        r = rstd.reshape(-1, 1)  # [N, 1]
        w = weight.to(compute)
        t = g * xf  # [N, d]
        gw = (r.t() @ t).view(d) if ctx.needs_input_grad[1] else None  # sum_n rstd_n g_n x_n
        gx = None
        if ctx.needs_input_grad[0]:
            c = (t @ w)[:, None].mul_(r.pow(3)).div_(-d)  # [N, 1]: -rstd^3 (g w . x) / d
            gx = torch.mul(g, w).mul_(r).addcmul_(xf, c).view(x.shape).to(x.dtype)
        return gx, (gw.to(weight.dtype) if gw is not None else None), None


class RMSNorm(nn.Module):
    """Root-mean-square norm, numerically as Hugging Face's ``LlamaRMSNorm``.

    Args:
        dim: hidden size ``d``.
        eps: added to ``mean(x^2)`` inside the rsqrt.
        scale: a fixed (non-learnable) output multiplier, used by LayerNorm Scaling.
        impl: ``reference``, ``fused`` or ``auto`` (fused eager, reference while compiling; see the module
            docstring).
    """

    def __init__(self, dim: int, eps: float = 1e-5, scale: float = 1.0, impl: str = "auto") -> None:
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        self.dim, self.eps, self.scale, self.impl = dim, eps, scale, impl
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., d]; the statistic and the product in float32, cast back before the gain (as HF does)
        if self.impl == "fused" or (self.impl == "auto" and not torch.compiler.is_compiling()):
            y = RMSNormFunction.apply(x, self.weight, self.eps)
        else:
            xf = x.to(torch.promote_types(x.dtype, torch.float32))
            y = (xf * torch.rsqrt(second_moment(x) + self.eps)).to(x.dtype)
            y = self.weight * y
        return y * self.scale if self.scale != 1.0 else y

    def extra_repr(self) -> str:
        s = f"{self.dim}, eps={self.eps}" + (f", impl={self.impl}" if self.impl != "auto" else "")
        return s + (f", scale={self.scale:.4g}" if self.scale != 1.0 else "")

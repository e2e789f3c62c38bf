"""BHyT, Bounded Hyperbolic Tanh (arXiv 2601.09719), and BHyT* with exact statistics.

docs/method.md, sections 2-3. One site computes ``gamma * tanh(lambda * x / D(x))`` where the bound is
``D = kappa * sqrt(m + eps)`` (``stat="rms"``, the released code) or
``D = kappa * sqrt(var + eps) + |mu|`` (``stat="meanstd"``, the paper's ideal form). By Chebyshev
at least a fraction ``p`` of the coordinates satisfy ``|x_i| <= D``, so the tanh argument stays in
``[-lambda, lambda]``.

``bhyt`` makes exactly one reduction per block: site B does not reduce over ``h = x + Attn(u)``
but uses the statistic of ``x`` plus the variance the attention adds,
``c * stopgrad(lambda_A)^2 / kappa^2`` with ``c = ||W_V W_O||_F^2 / (T d)`` cached per layer.
``exact_layers`` (off by default, as in the released code) gives chosen layers exact statistics at
site B instead: the approximation assumes attention uniform over all ``T`` tokens and under-predicts
the moment of ``h`` where the residual stream is still small (the first layers).

Two implementations of a site compute the same function (``impl``): ``reference`` is the formula in
plain autograd ops (it saves the tanh output for backward); ``fused`` saves only the site input and
per-token scalars and recomputes the tanh in backward. ``auto`` (the default) is ``fused`` on CPU and
while compiling, and ``reference`` in eager mode on CUDA and other devices: the eager Function was
measured on CPU only, and on CUDA it runs as one block with several activation-sized float32
temporaries. The fused paths:
- eager, ``BHyTSiteFunction``: one autograd Function per site with the statistic inside (site A
  returns its statistic for site B, whose gradient comes back into site A's backward), run over
  cache-sized row blocks so that its intermediates are reused buffers, with ``rational_tanh``
  computed in place (ATen's float32 tanh is about 100x a multiply on this CPU build; float64 keeps
  ``torch.tanh``). Both pre-norm sites cost about 1.2x RMSNorm's eager Function, against 2.9x for
  ``reference`` (docs/performance.md).
- while ``torch.compile`` traces, ``_SiteFunction`` and ``_SecondMoment`` with the rational tanh,
  which inductor turns into one vectorised loop per pass.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from bhyt_pl.norms.base import BlockNorms, NormScheme, register_norm
from bhyt_pl.norms.rmsnorm import IMPLS, RMSNorm
from bhyt_pl.tensors import full_tensor

__all__ = [
    "IMPLS",
    "BHyT",
    "BHyTBlockNorms",
    "BHyTExactScheme",
    "BHyTScheme",
    "BHyTSiteFunction",
    "UNBOUND_SEQ_LEN",
    "SiteStats",
    "rational_tanh",
    "satisfies_variance_bound",
    "vo_constant",
]

STATS = ("rms", "meanstd")

# Odd/even coefficients of a [13/6] rational approximation of tanh on [-TANH_CLAMP, TANH_CLAMP]
# (the float32 kernel of Eigen, which XLA also uses); beyond the clamp tanh rounds to +-1 in float32.
_TANH_P = (
    4.89352455891786e-03,
    6.37261928875436e-04,
    1.48572235717979e-05,
    5.12229709037114e-08,
    -8.60467152213735e-11,
    2.00018790482477e-13,
    -2.76076847742355e-16,
)
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)
TANH_CLAMP = 7.90531110763549805

UNBOUND_SEQ_LEN = 1024
"""``T`` of a ``bhyt`` scheme whose ``seq_len`` no run has bound: the paper's pretraining length."""

MOMENT_RATIO_FIRST_POSITIONS = 8
"""``bhyt_moment_ratio_first8`` covers sequence positions ``0 .. MOMENT_RATIO_FIRST_POSITIONS - 1``."""


class SiteStats(NamedTuple):
    """Per-token statistics of a site input, float32, shape [..., 1].

    ``spread`` is the uncentered second moment ``m`` for ``stat="rms"`` and the variance for
    ``stat="meanstd"``; ``mean`` is None for ``rms``. The site-B correction adds to ``spread``.
    """

    mean: torch.Tensor | None
    spread: torch.Tensor


def satisfies_variance_bound(lam: float, kappa: float, n_layers: int) -> bool:
    """The paper's condition ``lambda / kappa < 1 / sqrt(L)`` under which BHyT's per-layer output
    variance bound is below LayerNorm Scaling's."""
    return lam / kappa < 1.0 / math.sqrt(n_layers)


def vo_constant(w_v: torch.Tensor, w_o: torch.Tensor, n_head: int, n_kv_head: int, seq_len: int) -> torch.Tensor:
    """``c = ||W_V W_O||_F^2 / (T d)`` with the GQA expansion (docs/method.md, section 3).

    Args:
        w_v: value projection weight, ``nn.Linear`` layout [n_kv_head * head_dim, d].
        w_o: output projection weight, [d, n_head * head_dim].
        n_head, n_kv_head: query and key/value heads; each KV head's rows repeat over its group.
        seq_len: ``T``, the training sequence length.

    Returns:
        A scalar tensor, float32 or wider.
    """
    d = w_v.shape[1]
    head_dim = w_v.shape[0] // n_kv_head
    dtype = torch.promote_types(w_v.dtype, torch.float32)
    wv = w_v.to(dtype).view(n_kv_head, head_dim, d)  # [kv, hd, d]
    wv = wv.repeat_interleave(n_head // n_kv_head, dim=0).reshape(n_head * head_dim, d)  # [H*hd, d], as attention
    product = w_o.to(dtype) @ wv  # [d, d]: the linear map x -> o_proj(v_proj(x)) per attended token
    return product.pow(2).sum() / (seq_len * d)


def rational_tanh(z: torch.Tensor) -> torch.Tensor:
    """``tanh(z)`` from multiplies, adds and one divide, which inductor vectorises on CPU (its
    ``torch.tanh`` is about 3x slower there). Max relative error vs ``torch.tanh`` about 4e-7 over
    the whole float32 line (tests/norms/test_fused.py). Float64 input gets the exact ``torch.tanh``.
    """
    if z.dtype == torch.float64:
        return torch.tanh(z)
    return _rational_tanh(z)


def _rational_tanh(z: torch.Tensor) -> torch.Tensor:
    z = z.clamp(-TANH_CLAMP, TANH_CLAMP)
    z2 = z * z
    p = _TANH_P[6]
    for a in reversed(_TANH_P[:6]):  # Horner in z^2
        p = p * z2 + a
    q = _TANH_Q[3]
    for b in reversed(_TANH_Q[:3]):
        q = q * z2 + b
    return z * p / q


class _SiteFunction(torch.autograd.Function):
    """``y = (gamma * tanh(scale * x)).to(x.dtype)``; saves ``x``, ``scale`` [..., 1] and ``gamma``
    only and recomputes the tanh in backward (one pass over the activations in each direction). Reached
    only while ``torch.compile`` traces (eager fused sites run ``BHyTSiteFunction``), so its tanh is
    ``rational_tanh``, which inductor turns into one vectorised loop."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, scale, weight)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return (weight * rational_tanh(scale * xf)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, scale, weight = ctx.saved_tensors
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        t = rational_tanh(scale * xf)
        g = grad.to(t.dtype)
        gz = g * weight * (1 - t * t)  # d tanh(z)/dz = 1 - tanh^2
        gx = (gz * scale).to(x.dtype) if ctx.needs_input_grad[0] else None
        gs = (gz * xf).sum(dim=-1, keepdim=True).sum_to_size(scale.shape) if ctx.needs_input_grad[1] else None
        gw = (g * t).sum_to_size(weight.shape).to(weight.dtype) if ctx.needs_input_grad[2] else None
        return gx, gs, gw


class _SecondMoment(torch.autograd.Function):
    """``mean(x^2)`` over the last dim in at least float32, saving ``x`` in its own dtype (plain ops
    would save a float32 copy of a bfloat16 input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.to(torch.promote_types(x.dtype, torch.float32)).pow(2).mean(dim=-1, keepdim=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        xf = x.to(grad.dtype)
        return (grad * (2.0 / x.shape[-1]) * xf).to(x.dtype)


SITE_BLOCK_ELEMENTS = 1 << 17
"""Elements per row block of ``BHyTSiteFunction`` (512 KiB of float32): its temporaries stay in
cache and are reused; only the output (forward) and the input gradient (backward) are full size."""


def _tanh_(z: torch.Tensor, work: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``tanh`` of ``z`` in place: ``torch.tanh`` for float64, else the rational form in place, with
    three buffers of ``z``'s shape (ATen's float32 tanh costs about 100 multiplies on this CPU build)."""
    if z.dtype == torch.float64:
        return z.tanh_()
    z2, p, q = work
    coef = _coefficients(z.dtype, z.device)
    z.clamp_(-TANH_CLAMP, TANH_CLAMP)
    torch.mul(z, z, out=z2)
    torch.mul(z2, _TANH_P[6], out=p).add_(_TANH_P[5])  # (a 0-d tensor as addcmul's factor is 60x slower)
    for i in range(4, -1, -1):  # Horner in z^2, one pass per coefficient: p = a_i + p z^2
        torch.addcmul(coef[i], p, z2, out=p)
    torch.mul(z2, _TANH_Q[3], out=q).add_(_TANH_Q[2])
    for i in (8, 7):
        torch.addcmul(coef[i], q, z2, out=q)
    return z.mul_(p).div_(q)


@functools.cache
def _coefficients(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``_TANH_P`` then ``_TANH_Q`` as 0-d tensors (the addend of ``addcmul`` is a tensor)."""
    return tuple(torch.tensor(c, dtype=dtype, device=device) for c in _TANH_P + _TANH_Q)


def _blocks(n: int, d: int, device: torch.device):
    """Row ranges of at most ``SITE_BLOCK_ELEMENTS`` elements (at least one row) on CPU; one block elsewhere
    (a GPU has no such cache to fit, and every block costs kernel launches)."""
    rows = max(1, SITE_BLOCK_ELEMENTS // d) if device.type == "cpu" else max(n, 1)
    return ((r, min(r + rows, n)) for r in range(0, n, rows)), min(rows, n)


class BHyTSiteFunction(torch.autograd.Function):
    """One eager BHyT site, ``y = gamma * tanh(lambda * x / D)``, with its statistic inside.

    ``apply(x, mean, spread, lam, weight, eps, kappa, stat, save_tanh)``. With ``spread`` None the
    site computes exact statistics of ``x`` (site A, BHyT*, the final norm) and returns them too,
    ``(y, spread)`` for ``rms`` and ``(y, spread, mean)`` for ``meanstd``, so that a later site can use
    them (site B) and send its gradient back here; given ``spread`` (and ``mean`` for ``meanstd``), it
    returns ``y`` and gradients for the given statistics.

    Saved: ``x`` in its own dtype, the per-token ``1/D`` and statistics, ``lambda`` and ``gamma``; the
    tanh is recomputed in backward (``save_tanh`` saves it instead: one more activation-sized tensor,
    measured slower here, docs/performance.md). Both directions run over row blocks of
    ``SITE_BLOCK_ELEMENTS``, so every intermediate is a reused, cache-sized buffer and the tanh of float32
    and bfloat16 is ``rational_tanh`` computed in place. Backward, with ``t = tanh(s x)``,
    ``s = lambda / D``: ``gz = g gamma (1 - t^2)``, ``d gamma = sum_n g t``, ``gs = gz . x`` per
    token, ``d lambda = sum_n gs / D``, then through ``1/D`` to the statistics and from them to ``x``.
    """

    @staticmethod
    def forward(ctx, x, mean, spread, lam, weight, eps: float, kappa: float, stat: str, save_tanh: bool):
        compute = torch.promote_types(x.dtype, torch.float32)
        x = x.contiguous()
        d = x.shape[-1]
        x2 = x.view(-1, d)
        exact = spread is None
        if exact:
            xf = x2.to(compute)
            if stat == "rms":  # one read: ||x||^2 / d
                spread = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(d)
            else:
                spread, mean = torch.var_mean(xf, dim=-1, keepdim=True, correction=0)
            spread = spread.view(*x.shape[:-1], 1)
            mean = None if mean is None else mean.view(*x.shape[:-1], 1)
        if stat == "rms":
            inv = (spread.to(compute) + eps).rsqrt_().div_(kappa)  # 1 / D, [..., 1]
        else:
            inv = torch.sqrt(spread.to(compute) + eps).mul_(kappa).add_(mean.to(compute).abs()).reciprocal_()
        scale = (inv * lam.to(compute)).view(-1, 1)
        y = torch.empty_like(x)
        y2 = y.view(-1, d)
        t_all = torch.empty(x2.shape, dtype=compute, device=x.device) if save_tanh else None
        blocks, rows = _blocks(x2.shape[0], d, x.device)
        work = [torch.empty(rows, d, dtype=compute, device=x.device) for _ in range(4)]
        w = weight.to(compute)
        for r0, r1 in blocks:
            z = work[0][: r1 - r0] if t_all is None else t_all[r0:r1]
            t = _tanh_(torch.mul(x2[r0:r1], scale[r0:r1], out=z), [b[: r1 - r0] for b in work[1:]])
            if y.dtype == compute and t_all is None:
                torch.mul(t, w, out=y2[r0:r1])
            else:
                y2[r0:r1].copy_(torch.mul(t, w, out=work[1][: r1 - r0]))
        ctx.exact, ctx.stat, ctx.kappa, ctx.eps = exact, stat, kappa, eps
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, inv, spread, mean if stat == "meanstd" else None, lam, weight, t_all)
        if not exact:
            return y
        return (y, spread) if stat == "rms" else (y, spread, mean)

    @staticmethod
    def backward(ctx, grad, *stat_grads):
        x, inv, spread, mean, lam, weight, t_all = ctx.saved_tensors
        needs, exact, meanstd = ctx.needs_input_grad, ctx.exact, ctx.stat == "meanstd"
        compute, d = inv.dtype, x.shape[-1]
        x2 = x.view(-1, d)
        n = x2.shape[0]
        column = lambda v: None if v is None else v.reshape(-1, 1).to(compute)  # noqa: E731
        inv2 = column(inv)
        scale = inv2 * lam.to(compute)
        # d y / d statistic per token, as a multiple of gs = d y / d s: through 1/D
        mean2 = column(mean) if meanstd else None  # once, not per row block
        if meanstd:  # 1/D = 1 / (kappa sqrt(v + eps) + |mu|)
            f_spread = (scale * inv2).mul_(-0.5 * ctx.kappa).mul_(torch.rsqrt(column(spread) + ctx.eps))
            f_mean = (scale * inv2).neg_().mul_(torch.sign(mean2))
        else:  # 1/D = (m + eps)^-1/2 / kappa
            f_spread, f_mean = (scale * -0.5).div_(column(spread) + ctx.eps), None
        g_in = [column(g) for g in stat_grads] + [None, None]  # later sites' gradients into these statistics
        if grad is None:  # only the statistics were used: no gradient to lambda or gamma (undefined, not 0)
            grad = torch.zeros_like(x)
            needs = (needs[0], needs[1], needs[2], False, False)
        g2 = grad.contiguous().view(-1, d)
        w = weight.to(compute)
        gs = torch.empty(n, 1, dtype=compute, device=x.device)
        gw = torch.zeros(d, dtype=compute, device=x.device) if needs[4] else None
        gx = torch.empty_like(x) if needs[0] else None
        blocks, rows = _blocks(n, d, x.device)
        work = [torch.empty(rows, d, dtype=compute, device=x.device) for _ in range(7)]
        for r0, r1 in blocks:
            k = r1 - r0
            z, z2, p, q, gz, xb, gb = (b[:k] for b in work)
            xc = x2[r0:r1] if x.dtype == compute else xb.copy_(x2[r0:r1])
            gc = g2[r0:r1] if g2.dtype == compute else gb.copy_(g2[r0:r1])
            t = t_all[r0:r1] if t_all is not None else _tanh_(torch.mul(xc, scale[r0:r1], out=z), (z2, p, q))
            if gw is not None:
                gw.add_(torch.mul(gc, t, out=gz).sum(0))
            torch.ops.aten.tanh_backward.grad_input(torch.mul(gc, w, out=gz), t, grad_input=gz)  # g gamma (1 - t^2)
            gs_c = gs[r0:r1]
            torch.linalg.vecdot(gz, xc, out=gs_c.view(-1))
            if gx is None:
                continue
            out = gx.view(-1, d)[r0:r1] if gx.dtype == compute else gb
            torch.mul(gz, scale[r0:r1], out=out)
            if exact:  # m = |x|^2 / d (rms); v = |x|^2 / d - mu^2 and mu = sum x / d (meanstd)
                a = gs_c * f_spread[r0:r1]
                if g_in[0] is not None:
                    a.add_(g_in[0][r0:r1])
                out.addcmul_(xc, a.mul_(2.0 / d))
                if meanstd:
                    b = gs_c * f_mean[r0:r1]
                    if g_in[1] is not None:
                        b.add_(g_in[1][r0:r1])
                    out.add_(b.div_(d).sub_(a * mean2[r0:r1]))
            if out is gb:
                gx.view(-1, d)[r0:r1].copy_(out)
        g_lam = (gs * inv2).sum().reshape(lam.shape).to(lam.dtype) if needs[3] else None
        gw = gw.to(weight.dtype) if gw is not None else None
        if exact:
            return gx, None, None, g_lam, gw, None, None, None, None
        g_mean = (gs * f_mean).view(mean.shape).to(mean.dtype) if needs[1] and meanstd else None
        g_spread = (gs * f_spread).view(spread.shape).to(spread.dtype) if needs[2] else None
        return gx, g_mean, g_spread, g_lam, gw, None, None, None, None


class BHyT(nn.Module):
    """One BHyT site: ``gamma * tanh(lambda * x / D)``.

    Args:
        dim: hidden size ``d``.
        lambda_init: initial ``lambda`` (bound of the tanh argument).
        kappa: Chebyshev width ``1/sqrt(1-p)``.
        eps: added to the second moment (or variance) inside the square root.
        learnable_lambda: a parameter if True, else a fixed buffer that never trains.
        stat: ``rms`` or ``meanstd`` (see module docstring).
        impl: ``reference`` (plain ops), ``fused`` (``BHyTSiteFunction`` eager, the traced Functions while
            compiling) or ``auto`` (``fused`` while compiling and on CPU; eager on other devices,
            ``reference``; see the module docstring).
        save_tanh: the eager ``BHyTSiteFunction`` saves its tanh for backward (one more activation-sized
            tensor per site) instead of recomputing it from the saved input (docs/performance.md).
    """

    def __init__(
        self,
        dim: int,
        lambda_init: float,
        kappa: float,
        eps: float,
        learnable_lambda: bool = True,
        stat: str = "rms",
        impl: str = "auto",
        save_tanh: bool = False,
    ) -> None:
        super().__init__()
        if stat not in STATS:
            raise ValueError(f"stat must be one of {', '.join(STATS)}; got {stat!r}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        self.dim, self.lambda_init, self.kappa, self.eps, self.stat = dim, lambda_init, kappa, eps, stat
        self.impl, self.save_tanh = impl, save_tanh
        self.weight = nn.Parameter(torch.empty(dim))
        if learnable_lambda:
            self.lambda_ = nn.Parameter(torch.empty(1))  # 1-element, not 0-d: FSDP2 shards no scalars
        else:  # a buffer, so "fixed" really is fixed (a Parameter would reset requires_grad)
            self.register_buffer("lambda_", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        with torch.no_grad():
            self.lambda_.fill_(self.lambda_init)

    def fused(self) -> bool:
        """Whether this call takes a fused path: ``fused`` always, ``reference`` never, ``auto`` while compiling
        and for parameters on the CPU (the only device ``BHyTSiteFunction`` was measured on)."""
        if self.impl == "auto":
            return torch.compiler.is_compiling() or self.weight.device.type == "cpu"
        return self.impl == "fused"

    def eager_function(self) -> bool:
        """Whether this call runs ``BHyTSiteFunction`` (a fused path outside ``torch.compile``)."""
        return self.fused() and not torch.compiler.is_compiling()

    def _function(self, x: torch.Tensor, stats: SiteStats | None):
        mean, spread = (None, None) if stats is None else stats
        return BHyTSiteFunction.apply(
            x, mean, spread, self.lambda_, self.weight, self.eps, self.kappa, self.stat, self.save_tanh
        )

    def statistics(self, x: torch.Tensor) -> SiteStats:
        """Exact per-token statistics of ``x`` over the hidden dim, at least float32."""
        if self.stat == "rms" and self.fused():
            return SiteStats(None, _SecondMoment.apply(x))
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        if self.stat == "rms":
            return SiteStats(None, xf.pow(2).mean(dim=-1, keepdim=True))
        var, mean = torch.var_mean(xf, dim=-1, keepdim=True, correction=0)
        return SiteStats(mean, var)

    def inverse_bound(self, stats: SiteStats) -> torch.Tensor:
        """``1 / D``: ``rsqrt(m + eps) / kappa`` or ``1 / (kappa * sqrt(var + eps) + |mu|)``."""
        if stats.mean is None:
            return torch.rsqrt(stats.spread + self.eps) / self.kappa
        return 1.0 / (self.kappa * torch.sqrt(stats.spread + self.eps) + stats.mean.abs())

    def preactivation(self, x: torch.Tensor, stats: SiteStats | None = None) -> torch.Tensor:
        """The tanh argument ``lambda * x / D`` in float32; exact statistics when ``stats`` is None."""
        if stats is None:
            stats = self.statistics(x)
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        return (self.lambda_ * self.inverse_bound(stats)) * xf

    def scalars(self) -> dict[str, torch.Tensor]:
        """``{"lambda": lambda}`` for diagnostics (the ``BoundedSite`` interface)."""
        return {"lambda": self.lambda_}

    def forward(
        self, x: torch.Tensor, stats: SiteStats | None = None, return_stats: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, SiteStats]:
        """The site's output; with ``return_stats`` (exact statistics only) also ``statistics(x)``, the
        statistic site B reuses, which the eager Function computes in the same pass."""
        if return_stats:
            if stats is not None:
                raise ValueError("return_stats computes exact statistics; pass stats=None")
            if self.eager_function():
                out = self._function(x, None)
                return out[0], SiteStats(out[2] if self.stat == "meanstd" else None, out[1])
            stats = self.statistics(x)
            return self.forward(x, stats), stats
        if self.eager_function():
            out = self._function(x, stats)
            return out if stats is not None else out[0]
        if not self.fused():
            return (self.weight * torch.tanh(self.preactivation(x, stats))).to(x.dtype)
        if stats is None:
            stats = self.statistics(x)
        scale = self.lambda_ * self.inverse_bound(stats)  # [..., 1], float32: lambda / D per token
        return _SiteFunction.apply(x, scale, self.weight)

    def extra_repr(self) -> str:
        learn = isinstance(self.lambda_, nn.Parameter)
        return (
            f"{self.dim}, lambda_init={self.lambda_init}, kappa={self.kappa:.4g}, stat={self.stat}, "
            f"learnable={learn}, impl={self.impl}"
        )


class BHyTBlockNorms(BlockNorms):
    """BHyT's two sites of one block; site B reuses site A's statistic when ``approximate``.

    ``c`` is a non-persistent buffer: it is never saved or loaded, only recomputed from the
    current weights by ``refresh_constants`` (after init, after every load, during training).
    """

    def __init__(self, attn_in: BHyT, mlp_in: BHyT, approximate: bool, seq_len: int) -> None:
        super().__init__(attn_in=attn_in, mlp_in=mlp_in)
        self.approximate, self.seq_len = approximate, seq_len
        self.register_buffer("c", torch.zeros((), dtype=torch.float32), persistent=False)

    def pre_attn(self, x: torch.Tensor) -> tuple[torch.Tensor, SiteStats]:
        return self.attn_in(x, return_stats=True)  # the block's one reduction (site A), through the hooks

    def approximate_stats(self, stats: SiteStats) -> SiteStats:
        """Site B's statistic of ``h = x + Attn(u)`` from site A's: ``m + c * sg(lambda_A)^2 / kappa^2``."""
        kappa = self.attn_in.kappa
        correction = self.c * self.attn_in.lambda_.detach() ** 2 / kappa**2  # no grad to lambda_A or to W_V, W_O
        return SiteStats(stats.mean, stats.spread + correction)

    def pre_mlp(self, h: torch.Tensor, ctx: SiteStats) -> torch.Tensor:
        if not self.approximate:  # BHyT*: a second, exact reduction over h
            return self.mlp_in(h)
        return self.mlp_in(h, self.approximate_stats(ctx))  # site B: no reduction over h (docs/method.md, section 3)

    def site_statistics(
        self, site: str, args: tuple[Any, ...], saturation_threshold: float = 2.0
    ) -> dict[str, tuple[torch.Tensor, float | torch.Tensor]]:
        """``BlockNorms.site_statistics`` plus, at an approximated site B, the moment ratios: the statistic
        the forward received (``approximate_stats`` of site A's) against the exact one over ``h``
        (docs/method.md, section 3). ``bhyt_moment_ratio``: approximated over exact second moment per
        token; ``bhyt_moment_ratio_of_means``: mean approximated over mean exact moment (dominated by the
        large tokens); ``bhyt_moment_ratio_first8`` / ``bhyt_moment_ratio_rest``: the per-token ratio over
        positions ``0 .. MOMENT_RATIO_FIRST_POSITIONS - 1`` and after (causal attention averages early
        queries over few keys)."""
        out = super().site_statistics(site, args, saturation_threshold)
        if site != "mlp_in" or not self.approximate or len(args) < 2 or not isinstance(args[1], SiteStats):
            return out
        n = args[0].flatten(0, -2).shape[0]  # tokens
        exact = self.mlp_in.statistics(args[0]).spread  # [B, T, 1]
        approx = args[1].spread.expand_as(exact)  # [B, T, 1]
        ratio = approx / exact.clamp_min(1e-30)  # [B, T, 1]
        out["bhyt_moment_ratio"] = (ratio.sum(), n)
        out["bhyt_moment_ratio_of_means"] = (approx.sum(), exact.sum())
        early = ratio[..., :MOMENT_RATIO_FIRST_POSITIONS, :]  # few visible keys
        out["bhyt_moment_ratio_first8"] = (early.sum(), early.numel())
        if ratio.shape[-2] > MOMENT_RATIO_FIRST_POSITIONS:
            late = ratio[..., MOMENT_RATIO_FIRST_POSITIONS:, :]
            out["bhyt_moment_ratio_rest"] = (late.sum(), late.numel())
        return out

    @torch.no_grad()
    def refresh_constants(self, attn: nn.Module) -> None:
        if not self.approximate:
            return
        w_v, w_o = full_tensor(attn.v_proj.weight), full_tensor(attn.o_proj.weight)
        if w_v.shape != (attn.n_kv_head * attn.head_dim, w_o.shape[0]) or w_o.ndim != 2:
            # FSDP1 outside ``summon_full_params``: the weights are flat views of a local shard, from
            # which c cannot be computed; NormConstantRefresh recomputes it inside summon_full_params
            return
        self.c.copy_(vo_constant(w_v, w_o, attn.n_head, attn.n_kv_head, self.seq_len))


def _exact_layers(value: int | list[int] | tuple[int, ...] | None) -> int | tuple[int, ...] | None:
    """``exact_layers`` as stored: None, an int ``k`` (the first k layers) or a sorted tuple of indices
    (a tuple, so that schemes stay hashable and compare equal however the list was written)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if isinstance(value, int) and value < 0:
            raise ValueError(f"invalid 'bhyt' norm configuration: exact_layers must be >= 0, got {value}")
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        if any(i < 0 for i in value):
            raise ValueError(f"invalid 'bhyt' norm configuration: exact_layers indices must be >= 0, got {list(value)}")
        return tuple(sorted(set(value)))
    raise TypeError(
        "invalid 'bhyt' norm configuration: exact_layers must be None, an int k (the first k layers) or a list "
        f"of layer indices such as [0, 1]; got {value!r}"
    )


class _BHyTSchemeBase(NormScheme):
    approximate: bool

    def __init__(
        self,
        lambda_attn: float = 2.0,
        lambda_mlp: float = 1.0,
        lambda_final: float = 0.0,
        learnable_lambda: bool = True,
        p: float = 0.99,
        kappa: float | None = None,
        stat: str = "rms",
        eps: float = 1e-6,
        final_eps: float = 1e-5,
        impl: str = "auto",
        save_tanh: bool = False,
    ) -> None:
        self.lambda_attn, self.lambda_mlp, self.lambda_final = lambda_attn, lambda_mlp, lambda_final
        self.learnable_lambda, self.p, self.kappa, self.stat = learnable_lambda, p, kappa, stat
        self.eps, self.final_eps, self.impl, self.save_tanh = eps, final_eps, impl, save_tanh
        problems = []
        for n, v in (("lambda_attn", lambda_attn), ("lambda_mlp", lambda_mlp)):
            if not v > 0:
                problems.append(f"{n} must be > 0, got {v}")
        if not lambda_final >= 0:
            problems.append(f"lambda_final must be >= 0 (0 selects an RMSNorm final norm), got {lambda_final}")
        if kappa is None and not 0 < p < 1:
            problems.append(f"p must be in (0, 1) (kappa = 1/sqrt(1-p)), got {p}")
        if kappa is not None and not kappa > 0:
            problems.append(f"kappa must be > 0 (or None to derive it from p), got {kappa}")
        if stat not in STATS:
            problems.append(f"stat must be one of {', '.join(STATS)}; got {stat!r}")
        if not eps > 0:
            problems.append(f"eps must be > 0, got {eps}")
        if not final_eps > 0:
            problems.append(f"final_eps must be > 0, got {final_eps}")
        if impl not in IMPLS:
            problems.append(f"impl must be one of {', '.join(IMPLS)}; got {impl!r}")
        if not isinstance(save_tanh, bool):
            problems.append(f"save_tanh must be true or false, got {save_tanh!r}")
        self._raise_if(problems)

    @property
    def kappa_value(self) -> float:
        """``kappa``, or ``1/sqrt(1-p)`` when not given (p = 0.99 gives 10)."""
        return float(self.kappa) if self.kappa is not None else 1.0 / math.sqrt(1.0 - self.p)

    def _site(self, dim: int, lambda_init: float) -> BHyT:
        return BHyT(
            dim, lambda_init, self.kappa_value, self.eps, self.learnable_lambda, self.stat, self.impl, self.save_tanh
        )

    def _seq_len(self) -> int:
        return 1  # unused by the exact scheme

    def approximates(self, layer_idx: int, n_layers: int) -> bool:
        """Whether site B of layer ``layer_idx`` uses the approximated statistic (False: exact)."""
        return self.approximate

    def block_norms(self, dim: int, layer_idx: int, n_layers: int) -> BlockNorms:
        approximate = self.approximates(layer_idx, n_layers)
        return BHyTBlockNorms(
            self._site(dim, self.lambda_attn), self._site(dim, self.lambda_mlp), approximate, self._seq_len()
        )

    def final_norm(self, dim: int, n_layers: int) -> nn.Module:
        if self.lambda_final == 0:  # the released pretraining default
            return RMSNorm(dim, self.final_eps)
        return self._site(dim, self.lambda_final)  # exact statistics

    def variance_bound_report(self, n_layers: int) -> dict[str, bool]:
        """Whether each site's initial lambda satisfies ``lambda/kappa < 1/sqrt(L)``."""
        report = {
            "lambda_attn": satisfies_variance_bound(self.lambda_attn, self.kappa_value, n_layers),
            "lambda_mlp": satisfies_variance_bound(self.lambda_mlp, self.kappa_value, n_layers),
        }
        report["all"] = all(report.values())
        return report

    def diagnostics(self, n_layers: int, blocks: Sequence[BlockNorms] = ()) -> dict[str, Any]:
        """``variance_bound``: the theorem condition ``lambda/kappa < 1/sqrt(L)`` at the initial lambdas
        (``at_init``, as ``variance_bound_report``) and, given the model's ``blocks``, at the largest learned
        ``|lambda|`` of each site (``learned_max_lambda_attn``/``_mlp``, ``learned_holds``)."""
        kappa = float(self.kappa_value)
        threshold = 1.0 / math.sqrt(n_layers)
        report: dict[str, Any] = {
            "n_layers": n_layers,
            "kappa": kappa,
            "lambda_attn": self.lambda_attn,
            "lambda_mlp": self.lambda_mlp,
            "threshold": threshold,
            "at_init": self.variance_bound_report(n_layers),
        }
        if blocks:
            learned = {
                site: max(float(getattr(b, site).lambda_.detach().abs().max()) for b in blocks)
                for site in ("attn_in", "mlp_in")
            }
            report["learned_max_lambda_attn"] = learned["attn_in"]
            report["learned_max_lambda_mlp"] = learned["mlp_in"]
            report["learned_holds"] = all(v / kappa < threshold for v in learned.values())
        return {"variance_bound": report}


@register_norm("bhyt")
class BHyTScheme(_BHyTSchemeBase):
    """BHyT with one reduction per block (docs/method.md, section 3).

    Args:
        lambda_attn: initial lambda of site A (before attention). Released default 2; the paper's text uses 1.
        lambda_mlp: initial lambda of site B (before the MLP). Default 1.
        lambda_final: 0 for an RMSNorm final norm (released default), else the initial lambda of a
            BHyT final norm with exact statistics.
        learnable_lambda: train the lambdas (True) or keep them fixed.
        p: Chebyshev coverage; ``kappa = 1/sqrt(1-p)``.
        kappa: set kappa directly instead of through ``p``.
        stat: ``rms`` (released code) or ``meanstd`` (paper: ``kappa*s + |mu|``).
        eps: epsilon inside the square root of the statistic.
        final_eps: epsilon of the RMSNorm final norm when ``lambda_final = 0``.
        seq_len: ``T`` in ``c = ||W_V W_O||_F^2 / (T d)``: the training sequence length, a run fact
            (``run_facts``) that every entry point binds with ``bind(seq_len=...)``; unbound (None), the
            model uses ``UNBOUND_SEQ_LEN`` = 1024, the paper's pretraining length.
        impl: ``auto`` (``fused`` on CPU and while compiling, ``reference`` eager on other devices),
            ``fused`` (``BHyTSiteFunction`` eager, fused ops while compiling) or ``reference`` (plain ops);
            same function either way.
        save_tanh: the eager ``BHyTSiteFunction`` saves each site's tanh for backward instead of recomputing
            it (one more activation-sized tensor per site; a memory-for-time variant the bench's ``prenorm``
            part times as ``bhyt:save_tanh=true``). Same function either way.
        exact_layers: layers whose site B uses exact statistics (a second reduction over ``h``, as
            ``bhyt_exact``) instead of the approximation: None (the released method), an int ``k`` for
            the first ``k`` layers, or a list of 0-based layer indices (stored as a sorted tuple).
            Parameter names do not change. YAML ``exact_layers: [0, 1]``; study/bench
            ``bhyt:exact_layers=[0,1]``.
    """

    approximate = True
    needs_constant_refresh = True
    run_facts = ("seq_len",)

    def __init__(
        self,
        lambda_attn: float = 2.0,
        lambda_mlp: float = 1.0,
        lambda_final: float = 0.0,
        learnable_lambda: bool = True,
        p: float = 0.99,
        kappa: float | None = None,
        stat: str = "rms",
        eps: float = 1e-6,
        final_eps: float = 1e-5,
        seq_len: int | None = None,
        impl: str = "auto",
        exact_layers: int | list[int] | None = None,
        save_tanh: bool = False,
    ) -> None:
        self.seq_len = seq_len
        if not (seq_len is None or (isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0)):
            self._raise_if([f"seq_len must be a positive int (or None until the run binds it), got {seq_len!r}"])
        self.exact_layers = _exact_layers(exact_layers)
        super().__init__(
            lambda_attn, lambda_mlp, lambda_final, learnable_lambda, p, kappa, stat, eps, final_eps, impl, save_tanh
        )

    def _seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else UNBOUND_SEQ_LEN

    def approximates(self, layer_idx: int, n_layers: int) -> bool:
        exact = self.exact_layers
        if isinstance(exact, tuple) and exact and exact[-1] >= n_layers:
            raise ValueError(
                f"invalid 'bhyt' norm configuration: exact_layers {list(exact)} names layers beyond the model's "
                f"{n_layers} (indices are 0-based, 0 .. {n_layers - 1})"
            )
        if exact is None:
            return True
        return layer_idx >= exact if isinstance(exact, int) else layer_idx not in exact


@register_norm("bhyt_exact")
class BHyTExactScheme(_BHyTSchemeBase):
    """BHyT* : exact statistics at both sites (a second reduction over ``h``), no cached constant.

    Takes the same arguments as ``bhyt`` except ``seq_len``.
    """

    approximate = False

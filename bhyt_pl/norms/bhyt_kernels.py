"""BHyT's autograd kernels: the fused implementations of one site, ``gamma * tanh(lambda * x / D)``.

``bhyt_pl.norms.bhyt`` holds the method (the ``BHyT`` site, its block norms and the schemes); this file holds
the Functions its ``fused`` paths run, which compute the same function as the plain-ops formula
(``impl="reference"``) while saving only the site input and per-token scalars and recomputing the tanh in
backward:
- eager, ``BHyTSiteFunction``: one autograd Function per site with the statistic inside (site A
  returns its statistic for site B, whose gradient comes back into site A's backward), run over
  cache-sized row blocks so that its intermediates are reused buffers, with ``rational_tanh``
  computed in place (ATen's float32 tanh is about 100x a multiply on this CPU build; float64 keeps
  ``torch.tanh``). Both pre-norm sites cost about 1.2x RMSNorm's eager Function, against 2.9x for
  the plain ops (docs/performance.md).
- while ``torch.compile`` traces, ``CompiledSiteFunction`` and ``SecondMomentFunction`` with the rational
  tanh, which inductor turns into one vectorised loop per pass.
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "SITE_BLOCK_ELEMENTS",
    "TANH_CLAMP",
    "BHyTSiteFunction",
    "CompiledSiteFunction",
    "SecondMomentFunction",
    "rational_tanh",
]

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


class CompiledSiteFunction(torch.autograd.Function):
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


class SecondMomentFunction(torch.autograd.Function):
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

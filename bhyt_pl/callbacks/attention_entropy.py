"""Exact entropy of causal softmax attention without a [T, T] probability matrix.

``H_t = logsumexp_j s_tj - sum_j p_tj s_tj`` and ``sum_j p_tj s_tj = scale * q_t . sum_j p_tj k_j``: the
second term is an attention output whose values are the keys, so one fused attention call (values = keys)
that also returns the log-sum-exp gives both terms. Where the device has no such kernel, or it disagrees
with plain ops on a first check, the same quantities are computed exactly in chunks of queries.
Used by ``StabilityMonitor`` (``attn_entropy``).
"""

from __future__ import annotations

import logging
import math

import torch

__all__ = ["causal_attention_entropy"]

log = logging.getLogger(__name__)


def _lse_and_key_average(q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``logsumexp_j s_tj`` [B, H, T] and ``sum_j p_tj k_j`` [B, H, T, hd] of causal attention, from one
    fused kernel with the keys as values where the device has one that returns the log-sum-exp (the
    public ``scaled_dot_product_attention`` does not return it), else exactly in chunks of queries."""
    fused = _FUSED_OK.get(q.device.type)
    if fused is None:  # first use on this device type: check the kernel against plain ops on a slice
        fused = _FUSED_OK[q.device.type] = _fused_agrees(q[:1, :1, :64], k[:1, :1, :64], scale)
    if fused:
        try:
            return _lse_and_key_average_fused(q, k, scale)
        except (RuntimeError, NotImplementedError) as exc:  # e.g. a shape this kernel does not take
            log.debug("fused attention with log-sum-exp failed (%s); computing in chunks", exc)
    return _lse_and_key_average_chunked(q, k, scale)


_FUSED_OK: dict[str, bool] = {}
"""Per device type: whether the fused kernel's log-sum-exp agrees with plain ops (checked once)."""


def _lse_and_key_average_fused(q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    # the kernels scaled_dot_product_attention dispatches to; they return the log-sum-exp it discards
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, True, scale=scale)
        return lse, out
    if q.device.type == "cuda":
        efficient = torch.ops.aten._scaled_dot_product_efficient_attention
        out, lse = efficient(q, k, k, None, True, 0.0, True, scale=scale)[:2]  # lse may be padded in T
        return lse[..., : q.shape[-2]], out
    raise NotImplementedError(f"no fused attention kernel with log-sum-exp on {q.device.type}")


def _fused_agrees(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    try:
        lse, out = _lse_and_key_average_fused(q, k, scale)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # kernel missing on this build
        log.info("attention entropy: no fused attention kernel with log-sum-exp (%s); in query chunks", exc)
        return False
    ref_lse, ref_out = _lse_and_key_average_chunked(q, k, scale)
    ok = torch.allclose(lse, ref_lse, rtol=1e-3, atol=1e-3) and torch.allclose(out, ref_out, rtol=1e-3, atol=1e-3)
    if not ok:
        log.warning("attention entropy: the fused kernel's log-sum-exp disagrees with plain ops; in query chunks")
    return ok


def _lse_and_key_average_chunked(
    q: torch.Tensor, k: torch.Tensor, scale: float, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as ``_lse_and_key_average`` from plain ops, ``chunk`` queries at a time (memory bounded)."""
    T = q.shape[-2]
    lses, outs = [], []
    for start in range(0, T, chunk):
        qc = q[..., start : start + chunk, :]  # [B, H, C, hd]
        s = (qc @ k.transpose(-1, -2)) * scale  # [B, H, C, T]
        rows = torch.arange(start, start + qc.shape[-2], device=q.device)[:, None]
        s = s.masked_fill(torch.arange(T, device=q.device)[None, :] > rows, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [B, H, C]
        lses.append(lse)
        outs.append(torch.exp(s - lse[..., None]) @ k)
    return torch.cat(lses, dim=-1), torch.cat(outs, dim=-2)


def causal_attention_entropy(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Entropy in nats of every query's causal softmax attention distribution, exact, float32.

    ``H_t = logsumexp_j s_tj - E_p[s_t]`` with ``E_p[s_t] = scale * q_t . sum_j p_tj k_j``: the second
    term is an attention output whose values are the keys, so no [T, T] probability matrix is kept.

    Args:
        q: queries [B, H, T, hd] (after RoPE).
        k: keys [B, K, T, hd]; ``K`` divides ``H`` (grouped-query attention repeats each key head).
        scale: the score scale; ``1/sqrt(hd)`` by default, as ``scaled_dot_product_attention``.

    Returns:
        [B, H, T] entropies; query ``t`` sees keys ``0..t``, so ``0 <= H_t <= log(t + 1)``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = q.float()
    k = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # [B, H, T, hd]
    lse, key_average = _lse_and_key_average(q.contiguous(), k.contiguous(), scale)
    expected_score = scale * (q * key_average).sum(dim=-1)  # [B, H, T]
    return (lse - expected_score).clamp_min(0.0)  # >= 0 up to rounding

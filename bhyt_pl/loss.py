"""Next-token cross-entropy straight from the final hidden states, without the whole batch's logits.

At the paper's vocabulary (128256) the float32 logits of a batch, their log-softmax and their
gradient are most of a training step's memory: ``[B, T, V]`` three times over. ``linear_cross_entropy``
computes the output projection, the log-softmax and the NLL a chunk of tokens at a time and
recomputes each chunk's logits in backward, so at most one chunk's ``[C, V]`` float32 logits exist
at any moment. It is the same loss with the same gradients (tests/test_loss.py, float64).

Implementations (``impl``):
- ``chunked``: ``ChunkedLinearCrossEntropy`` below, any device and dtype (hand-written: torch has
  no fused linear cross-entropy, and the one library kernel, liger-kernel's, is Triton, CUDA only);
- ``liger``: liger-kernel's ``LigerFusedLinearCrossEntropyLoss`` (CUDA; ``pip install liger-kernel``),
  imported only when chosen;
- ``plain``: ``F.cross_entropy`` on the full float32 logits, the reference;
- ``auto``: ``liger`` on CUDA when it is installed, else ``chunked``.
"""

from __future__ import annotations

import importlib.util
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "LOSS_IMPLS",
    "ChunkedLinearCrossEntropy",
    "LossOutput",
    "default_chunk_tokens",
    "linear_cross_entropy",
    "resolve_impl",
]

LOSS_IMPLS = ("auto", "chunked", "liger", "plain")
REDUCTIONS = ("mean", "sum", "none")
CHUNK_ELEMENTS = 2**25
"""Logit elements per chunk by default (128 MiB in float32): at V = 128256 that is 261 tokens, at
V = 8192 4096 tokens. Big enough that the chunk's matmul runs at full speed."""


class LossOutput(NamedTuple):
    """What ``Llama.forward(idx, labels=...)`` returns."""

    loss: torch.Tensor
    """Mean (or summed, or per-token [B, T]) next-token NLL over supervised positions, float32 or wider."""
    tokens: torch.Tensor
    """Number of supervised positions (labels other than ``ignore_index``), an int64 scalar."""


def default_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk so that one chunk's logits hold about ``CHUNK_ELEMENTS`` numbers."""
    return max(1, CHUNK_ELEMENTS // vocab_size)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Per-token ``nll_i = logsumexp(h_i W^T) - (h_i W^T)[y_i]`` (0 where ``y_i == ignore_index``).

    The logits are ``h W^T`` in the inputs' dtype, then widened to at least float32, exactly as
    ``F.cross_entropy(F.linear(h, W).float(), y)`` computes them. Saves ``h``, ``W``, ``y`` and the
    per-token logsumexp; backward recomputes each chunk's logits (one extra ``h W^T`` matmul, a
    third of the output layer's FLOPs) and accumulates ``dW`` in at least float32.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int, ignore_index: int):
        # hidden [N, d], weight [V, d], labels [N] -> nll [N]
        compute = torch.promote_types(hidden.dtype, torch.float32)
        valid = labels != ignore_index
        target = torch.where(valid, labels, 0)
        nll = torch.empty(hidden.shape[0], dtype=compute, device=hidden.device)
        lse = torch.empty_like(nll)
        for s in range(0, hidden.shape[0], chunk):
            logits = F.linear(hidden[s : s + chunk], weight).to(compute)  # [C, V]
            lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
            nll[s : s + chunk] = lse[s : s + chunk] - logits.gather(1, target[s : s + chunk, None]).squeeze(1)
        nll = nll.masked_fill(~valid, 0.0)
        ctx.save_for_backward(hidden, weight, target, valid, lse)
        ctx.chunk = chunk
        return nll

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor):
        hidden, weight, target, valid, lse = ctx.saved_tensors
        chunk = ctx.chunk
        scale = torch.where(valid, grad_nll.to(lse.dtype), 0.0)  # [N]
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = torch.zeros(
                weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device
            )
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            # d nll / d logits = softmax(logits) - onehot(y), times the incoming gradient
            g = F.linear(h, weight).to(lse.dtype).sub_(lse[s : s + chunk, None]).exp_()  # [C, V], the softmax
            g.scatter_add_(1, target[s : s + chunk, None], torch.full_like(lse[s : s + chunk, None], -1.0))
            g.mul_(scale[s : s + chunk, None])
            g = g.to(weight.dtype)  # as autograd casts the gradient of ``logits.float()`` back
            if grad_h is not None:
                grad_h[s : s + chunk] = g @ weight
            if grad_w is not None:
                grad_w.addmm_(g.t().to(grad_w.dtype), h.to(grad_w.dtype))
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None


def _liger_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    # imported by name, not with an import statement: the exported Hugging Face modeling file carries this
    # function, and transformers refuses remote code whose import statements name an uninstalled package
    fused = importlib.import_module("liger_kernel.transformers.fused_linear_cross_entropy")
    return fused.LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction="sum")(weight, hidden, labels)


def resolve_impl(impl: str, device: torch.device) -> str:
    """The implementation ``impl`` stands for on ``device`` (``auto`` resolved); a clear error if unavailable."""
    if impl not in LOSS_IMPLS:
        raise ValueError(f"loss impl must be one of {', '.join(LOSS_IMPLS)}; got {impl!r}")
    liger_installed = importlib.util.find_spec("liger_kernel") is not None
    if impl == "auto":
        return "liger" if device.type == "cuda" and liger_installed else "chunked"
    if impl == "liger" and not (device.type == "cuda" and liger_installed):
        raise ValueError(
            "loss impl 'liger' needs a CUDA device and `pip install liger-kernel`"
            f" (device {device}, liger-kernel {'installed' if liger_installed else 'not installed'});"
            " use 'chunked' (or 'auto')"
        )
    return impl


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    impl: str = "auto",
    chunk_tokens: int | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
) -> LossOutput:
    """Cross-entropy of ``F.linear(hidden, weight)`` against ``labels`` without materialising all logits.

    Args:
        hidden: final hidden states [..., d] (after the final norm).
        weight: output projection [V, d] (the embedding matrix when tied).
        labels: target ids [...], ``ignore_index`` where a position is not supervised.
        impl: ``auto``, ``chunked``, ``liger`` or ``plain`` (see the module docstring).
        chunk_tokens: tokens per chunk of ``chunked``; default ``default_chunk_tokens(V)``.
        reduction: ``mean`` over supervised positions, ``sum``, or ``none`` (per-token NLL shaped like
            ``labels``, 0 at ignored positions; not available with ``liger``).
        ignore_index: label of unsupervised positions.

    Returns:
        ``LossOutput(loss, tokens)``; ``mean`` over zero supervised tokens is NaN, as ``F.cross_entropy``'s.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}; got {reduction!r}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match the hidden states' leading shape {tuple(hidden.shape[:-1])}"
        )
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        # autocast would run the forward's matmuls in its dtype but not the custom backward's: cast both
        # operands here, as autocast casts F.linear's (the casts are differentiable), and run without it
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            return linear_cross_entropy(
                hidden.to(dtype),
                weight.to(dtype),
                labels,
                impl=impl,
                chunk_tokens=chunk_tokens,
                reduction=reduction,
                ignore_index=ignore_index,
            )
    impl = resolve_impl(impl, hidden.device)
    if impl == "liger" and reduction == "none":
        impl = "chunked"  # liger returns reduced losses only
    h, y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    tokens = (y != ignore_index).sum()
    if impl == "liger":
        total = _liger_sum(h, weight, y, ignore_index).float()
        return LossOutput(total / tokens if reduction == "mean" else total, tokens)
    if impl == "plain":
        nll = F.cross_entropy(
            F.linear(h, weight).to(torch.promote_types(h.dtype, torch.float32)),
            y,
            ignore_index=ignore_index,
            reduction="none",
        )
    else:
        chunk = chunk_tokens or default_chunk_tokens(weight.shape[0])
        nll = ChunkedLinearCrossEntropy.apply(h, weight, y, chunk, ignore_index)
    if reduction == "none":
        return LossOutput(nll.view(labels.shape), tokens)
    total = nll.sum()
    return LossOutput(total / tokens if reduction == "mean" else total, tokens)

"""Summed token log-probabilities of many token rows, batched: the one computation behind the lm-eval
adapter's ``loglikelihood``/``loglikelihood_rolling`` and the sliding-window perplexity."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from bhyt_pl.model import Llama

__all__ = ["score_rows"]


@torch.inference_mode()
def score_rows(
    model: Llama,
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    batch_size: int = 16,
    pad_id: int = 0,
    greedy: bool = True,
) -> list[tuple[float, bool]]:
    """Log-probability of each row's ``targets`` given its ``inputs``, and whether greedy decoding yields them.

    A row ``(inputs, targets)`` is scored as one forward pass over ``inputs``; the last
    ``len(targets)`` positions predict ``targets`` (so ``inputs[-len(targets) + 1:] == targets[:-1]``
    for a contiguous text, as lm-eval's windows are). Rows are sorted longest first and right-padded
    within a batch: attention is causal and every norm scheme normalizes per token, so padding
    after a row's last input changes none of its logits (tests/eval/test_lm.py checks this).

    Args:
        model: any norm scheme's ``Llama``; run as is (put it in eval mode and on its device first).
        rows: ``(inputs, targets)`` token-id pairs, ``1 <= len(targets) <= len(inputs) <= max_seq_len``.
        batch_size: rows per forward pass.
        pad_id: id written after short rows (never attended to by the scored positions).
        greedy: also report whether the targets are the argmax. This needs the logits; without it
            (perplexity) the log-probabilities come from the model's chunked loss, which never holds a
            batch's float32 logits, and the flag is False.

    Returns:
        ``(sum of log p(target), all targets are the argmax)`` per row, in the order of ``rows``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    max_len = model.config.max_seq_len
    for i, (inputs, targets) in enumerate(rows):
        if not 1 <= len(targets) <= len(inputs) <= max_len:
            raise ValueError(
                f"row {i}: need 1 <= len(targets) <= len(inputs) <= max_seq_len={max_len}, "
                f"got {len(targets)} targets and {len(inputs)} inputs"
            )
    device = model.embed.weight.device
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: fewer pads, OOM early
    results: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = len(rows[chunk[0]][0])
        batch = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        for b, i in enumerate(chunk):
            inputs = rows[i][0]
            batch[b, : len(inputs)] = torch.as_tensor(list(inputs), dtype=torch.long)
        if not greedy:
            labels = torch.full_like(batch, -100)
            for b, i in enumerate(chunk):
                inputs, targets = rows[i]
                labels[b, len(inputs) - len(targets) : len(inputs)] = torch.as_tensor(list(targets), dtype=torch.long)
            nll = model(batch.to(device), labels=labels.to(device), loss_reduction="none").loss  # [B, width]
            for b, i in enumerate(chunk):
                results[i] = (-nll[b].sum().item(), False)
            continue
        logits = model(batch.to(device))  # [B, width, V]
        for b, i in enumerate(chunk):
            inputs, targets = rows[i]
            n, m = len(inputs), len(targets)
            logprobs = F.log_softmax(logits[b, n - m : n].float(), dim=-1)  # [m, V]
            target = torch.as_tensor(list(targets), dtype=torch.long, device=logprobs.device)
            total = logprobs.gather(-1, target[:, None]).sum().item()
            greedy = bool((logprobs.argmax(dim=-1) == target).all())
            results[i] = (total, greedy)
    return results

"""One full training step (forward, cross-entropy, backward, AdamW without weight decay, the norm scheme's
post-step weight constraint) of a whole model."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["train_step"]


def train_step(
    model: torch.nn.Module,
    batch: int,
    seq_len: int,
    vocab: int,
    hf: bool = False,
    post_step: Callable[[], None] | None = None,
):
    """``(step, forward_loss)`` on fixed random tokens; ``hf`` reads ``.logits`` of a transformers model;
    ``post_step`` runs after each optimizer step (ours: ``Llama.constrain_weights``, nGPT's weight
    constraint, as in fit; peers: None).

    The loss is computed here, outside both models, so ours and Hugging Face's do identical work.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen).to(device)
    inputs, targets = idx[:, :-1], idx[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()

    def forward_loss() -> torch.Tensor:
        logits = model(input_ids=inputs).logits if hf else model(inputs)  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def step() -> None:
        forward_loss().backward()
        optimizer.step()
        if post_step is not None:
            post_step()
        optimizer.zero_grad(set_to_none=True)

    return step, forward_loss

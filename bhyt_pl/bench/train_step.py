"""One full training step (forward, cross-entropy, backward, AdamW without weight decay, the norm scheme's
post-step weight constraint) of a whole model."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["train_step"]


def train_step(model: torch.nn.Module, batch: int, seq_len: int, vocab: int, hf: bool = False):
    """``(step, forward_loss)`` on fixed random tokens; ``hf`` reads ``.logits`` of a transformers model.

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

    constrain = getattr(model, "constrain_weights", None)  # the norm scheme's post-step hook (nGPT), as in fit

    def step() -> None:
        forward_loss().backward()
        optimizer.step()
        if constrain is not None:
            constrain()
        optimizer.zero_grad(set_to_none=True)

    return step, forward_loss

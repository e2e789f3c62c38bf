"""``bhyt_pl.bench.train_step``: the timed step is forward, cross-entropy, backward and one AdamW update."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.bench.train_step import train_step


def _tokens(batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(0)  # the step's own fixed tokens
    return torch.randint(0, vocab, (batch, seq_len + 1), generator=gen)


def test_the_loss_is_next_token_cross_entropy_and_a_step_is_one_adamw_update() -> None:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", n_layers=2, norm="bhyt"))
    vocab = model.config.vocab_size
    step, forward_loss = train_step(model, 2, 8, vocab)
    idx = _tokens(2, 8, vocab)
    with torch.no_grad():
        expected = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
    torch.testing.assert_close(forward_loss().detach(), expected)

    reference = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = torch.autograd.grad(
        F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()), list(model.parameters())
    )
    step()
    for (name, p), g in zip(model.named_parameters(), grads, strict=True):
        # AdamW's first step moves every weight by lr * sign(grad) (bias-corrected m / sqrt(v) = g / |g|)
        moved = p.detach() - reference[name]
        mask = g.abs() > 1e-4  # where Adam's eps (1e-8) is negligible against |g|
        # float32 weights near 1 round the 1e-5 update to within an ulp (1.2e-7)
        torch.testing.assert_close(moved[mask], -1e-5 * g[mask].sign(), atol=3e-7, rtol=0, msg=name)
        assert p.grad is None  # gradients released after the update


class _LogitsModel(nn.Module):
    """A transformers-shaped stand-in: called with ``input_ids``, returns an object with ``.logits``."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, vocab)

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.embed(input_ids))


def test_hf_models_are_called_with_input_ids_and_read_through_logits() -> None:
    model = _LogitsModel(11)
    _, forward_loss = train_step(model, 3, 5, 11, hf=True)
    idx = _tokens(3, 5, 11)
    expected = F.cross_entropy(model.embed.weight[idx[:, :-1]].flatten(0, 1), idx[:, 1:].flatten())
    torch.testing.assert_close(forward_loss(), expected)


def test_post_step_runs_after_each_update() -> None:
    """Ours passes ``Llama.constrain_weights``: nGPT's matrices are back on the unit sphere after a step."""
    model = Llama(LlamaConfig.from_name("tiny", n_layers=1, norm="ngpt", tie_embeddings=False))
    calls = []
    step, _ = train_step(model, 2, 8, model.config.vocab_size, post_step=lambda: calls.append(1))
    step()
    assert calls == [1]
    step, _ = train_step(model, 2, 8, model.config.vocab_size, post_step=model.constrain_weights)
    step()
    for weight, dim in model.width_matrices():
        torch.testing.assert_close(weight.detach().norm(dim=dim), torch.ones(weight.shape[dim - 1]))

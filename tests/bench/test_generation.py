"""``bhyt_pl.bench.generation``: prefill is the prompt's last logits; generate is greedy decoding."""

from __future__ import annotations

import pytest
import torch

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.bench.generation import generation_fns


@pytest.fixture(scope="module")
def model() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig.from_name("tiny", n_layers=2, norm="bhyt"))


def _prompt(batch: int, prompt_len: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(1)  # the bench's fixed prompt
    return torch.randint(0, vocab, (batch, prompt_len), generator=gen)


def test_prefill_and_generate_match_a_cache_free_greedy_loop(model: Llama) -> None:
    vocab = model.config.vocab_size
    prefill, generate = generation_fns(model, 2, 5, 4, vocab)
    prompt = _prompt(2, 5, vocab)
    with torch.no_grad():
        torch.testing.assert_close(prefill(), model(prompt)[:, -1])
        tokens = prompt
        for _ in range(4):  # greedy, recomputing the whole sequence every step (no KV cache)
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    out = generate()
    assert out.shape == (2, 9)
    assert torch.equal(out, tokens)
    assert not model.training  # timed in eval mode


class _ShortHF(torch.nn.Module):
    """A transformers-like model whose ``generate`` stops early (an end-of-sequence token)."""

    def forward(self, input_ids: torch.Tensor, use_cache: bool = True):
        raise AssertionError("not called")

    def generate(self, prompt: torch.Tensor, **kwargs) -> torch.Tensor:
        return prompt

    def parameters(self, recurse: bool = True):
        yield torch.nn.Parameter(torch.zeros(1))


def test_a_generation_of_the_wrong_length_is_an_error() -> None:
    _, generate = generation_fns(_ShortHF(), 1, 3, 2, 7, hf=True)
    with pytest.raises(RuntimeError, match="generated 0 tokens, not 2"):
        generate()

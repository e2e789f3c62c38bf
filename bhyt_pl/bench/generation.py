"""Greedy generation with the KV cache: prefill and decode, for ours and Hugging Face's."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["generation_fns"]


def generation_fns(
    model: torch.nn.Module,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    vocab: int,
    hf: bool = False,
    compile: bool = False,
) -> tuple[Callable[[], object], Callable[[], object]]:
    """``(prefill, generate)``: the prompt's forward pass into a fresh cache, and the whole greedy
    generation of ``new_tokens`` (one prefill plus ``new_tokens - 1`` single-token decode steps).
    ``compile`` uses ours ``generate(compile=True)`` (static cache, one compiled decode step; the
    prefill stays eager, into a cache of the static length).

    Decode time is ``generate - prefill`` (medians), so decode throughput is
    ``batch * (new_tokens - 1) / (t_generate - t_prefill)``.
    """
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(device)
    model.eval()

    if hf:

        @torch.inference_mode()
        def prefill():  # fills a fresh DynamicCache, as generate's first step does
            return model(input_ids=prompt, use_cache=True).logits[:, -1]

        @torch.inference_mode()
        def generate():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            if out.shape[1] != prompt_len + new_tokens:
                raise RuntimeError(f"transformers generated {out.shape[1] - prompt_len} tokens, not {new_tokens}")
            return out

        return prefill, generate

    @torch.inference_mode()
    def prefill_ours():
        total = prompt_len + new_tokens
        cache = model.new_kv_cache(batch, model.static_cache_len(total) if compile else total)
        return model(prompt, cache, 0)[:, -1]

    @torch.inference_mode()
    def generate_ours():
        out = model.generate(prompt, new_tokens, compile=compile)
        if out.shape[1] != prompt_len + new_tokens:
            raise RuntimeError(f"generated {out.shape[1] - prompt_len} tokens, not {new_tokens}")
        return out

    return prefill_ours, generate_ours

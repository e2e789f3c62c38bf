"""Data-path throughput against the tiny model's training throughput (the data must not be the bottleneck).

    python -m bhyt_pl.data.benchmark [--seq-len 256] [--batch-size 8] [--steps 10]

Data: tokenize + pack the embedded train shards through ``C4DataModule`` (one pass, main process,
``num_workers=0``), in tokens/s. Model: ``Llama`` with the ``tiny`` preset (RMSNorm), forward +
backward + AdamW step on CPU, eager fp32, in tokens/s, after two warm-up steps.
"""

from __future__ import annotations

import argparse
import time

import torch

from bhyt_pl.config import LlamaConfig
from bhyt_pl.data.c4 import C4DataModule
from bhyt_pl.model import Llama


def data_tokens_per_sec(seq_len: int, batch_size: int) -> tuple[float, int]:
    dm = C4DataModule.embedded(seq_len=seq_len, batch_size=batch_size, shuffle_buffer=1000)
    dm.setup("fit")
    start, tokens = time.perf_counter(), 0
    for batch in dm.train_dataloader():
        tokens += batch["input_ids"].numel()
    return tokens / (time.perf_counter() - start), tokens


def model_tokens_per_sec(seq_len: int, batch_size: int, steps: int) -> float:
    model = Llama(LlamaConfig.from_name("tiny"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 8192, (batch_size, seq_len + 1))
    for step in range(steps + 2):
        if step == 2:
            start = time.perf_counter()
        logits = model(x[:, :-1])  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * batch_size * seq_len / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    data, tokens = data_tokens_per_sec(args.seq_len, args.batch_size)
    model = model_tokens_per_sec(args.seq_len, args.batch_size, args.steps)
    print(f"threads={torch.get_num_threads()} seq_len={args.seq_len} batch_size={args.batch_size}")
    print(f"data/tokens_per_sec  {data:12,.0f}  ({tokens:,} tokens, tokenize + pack, num_workers=0)")
    print(f"train/tokens_per_sec {model:12,.0f}  (tiny preset, fwd + bwd + AdamW, eager fp32)")
    print(f"ratio {data / model:.1f}x")


if __name__ == "__main__":
    main()

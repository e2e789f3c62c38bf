"""StabilityMonitor under FSDP2 (gloo, CPU) for tests/callbacks/test_stability.py; run with
``python -m torch.distributed.run --standalone --nproc_per_node N fsdp2_stability.py INIT_CKPT OUT_JSON``.

N = 2: ``ModelParallelStrategy`` shards every block over both ranks and each rank trains on half of the
batch (rank r takes windows r, r + 2, ...); ``train(init, 1)``: one process, the whole batch. Both start from the
weights in INIT_CKPT, train 2 steps with the monitor logging at steps 1 and 2, and rank 0 writes every
``stability/*`` value it logged to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import ModelParallelStrategy
from lm_fixtures import TINY_OVERRIDES, TokenDataModule

from bhyt_pl.callbacks import StabilityMonitor
from bhyt_pl.module import LlamaLM


class JsonLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.history: dict[int, dict[str, float]] = {}

    name, version = "json", 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.setdefault(step, {}).update({k: v for k, v in metrics.items() if k.startswith("stability/")})


def train(init: str, world: int) -> dict[int, dict[str, float]]:
    """The ``stability/*`` metrics rank 0 logged, by step; ``world`` 1 runs in the calling process."""
    torch.manual_seed(0)
    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, lr=1e-2, warmup_steps=0, init_checkpoint=init)
    logger = JsonLogger()
    monitor = StabilityMonitor(every_n_steps=1, figures=False, spike_window=2, spike_min_history=2)
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1) if world == 2 else "auto"
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_steps=2, logger=logger, callbacks=[monitor],
        use_distributed_sampler=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, gradient_clip_val=1.0,
    )  # fmt: skip
    trainer.fit(lm, datamodule=TokenDataModule(batch_size=4 // world))
    return logger.history if trainer.is_global_zero else {}


def main(init: str, out: str) -> None:
    history = train(init, int(os.environ["WORLD_SIZE"]))
    if history:
        with open(out, "w") as f:
            json.dump(history, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

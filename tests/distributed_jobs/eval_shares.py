"""torchrun job (2 ranks, gloo, CPU): ``validate``, ``test`` and ``predict`` of the C4 and LIMA data modules under
DDP and FSDP2, from one checkpoint's weights. Per rank it records what each stage read (a hash of every row, the
number of batches), the logged ``val/loss`` and ``test/loss`` and the per-sequence NLL of ``predict``;
tests/test_distributed.py compares them with one process (``evaluate`` with ``devices=1``).

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 eval_shares.py OUT_DIR INIT_CKPT
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DistributedSampler

from bhyt_pl import LlamaLM
from bhyt_pl.data import C4DataModule, LIMADataModule

LIMA_FILE = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "lima_tiny.jsonl"
STAGES = ("validate", "test", "predict")
LIMITS = {"c4": 3, "lima": 2}
"""Batches of the whole evaluation set: C4 3 x 2 windows (2 ranks: 3 windows each, a full and a partial batch);
LIMA 2 x 2 of its 6 held-out conversations (2 ranks: one batch of 2 each)."""


def data_module(name: str) -> L.LightningDataModule:
    if name == "c4":
        return C4DataModule.embedded(seq_len=32, batch_size=2)
    return LIMADataModule(data_files=str(LIMA_FILE), tokenizer="embedded", max_seq_len=64, batch_size=2,
                          val_split_fraction=0.75)  # fmt: skip


class BatchLog(L.Callback):
    """The rows each evaluation stage reads on this rank (trailing padding stripped), in order."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id, self.rows = pad_id, {stage: [] for stage in STAGES}

    def _record(self, stage: str, batch: dict[str, torch.Tensor]) -> None:
        for row in batch["input_ids"].tolist():
            while row and row[-1] == self.pad_id:
                row.pop()
            self.rows[stage].append(hashlib.sha1(str(row).encode()).hexdigest()[:16])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._record("validate", batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._record("test", batch)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._record("predict", batch)


def evaluate(data: str, init_ckpt: str, strategy: str = "auto", devices: int = 1) -> dict:
    """Validate, test and predict ``data`` with the checkpoint's weights; what this rank read and logged."""
    if strategy == "fsdp2":
        strategy = ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    dm = data_module(data)
    dm.prepare_data()
    dm.setup("validate")  # the pad id the batch log needs; the trainer sets the module up again per stage
    log = BatchLog(dm.special_tokens.pad_id)
    limit = LIMITS[data]
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[log],
        limit_val_batches=limit, limit_test_batches=limit, limit_predict_batches=limit,
    )  # fmt: skip
    model = LlamaLM(init_checkpoint=init_ckpt)
    val = trainer.validate(model, datamodule=dm, verbose=False)[0]["val/loss"]
    sampler = trainer.val_dataloaders.sampler
    test = trainer.test(model, datamodule=dm, verbose=False)[0]["test/loss"]
    scores = trainer.predict(model, datamodule=dm)
    return {
        "rows": log.rows,
        "val_loss": float(val),
        "test_loss": float(test),
        "nll": [float(x) for batch in scores for x in batch["nll"]],
        "tokens": [int(x) for batch in scores for x in batch["tokens"]],
        # LIMA's own sampler, kept by Lightning (its replacement would not drop the last items)
        "own_sampler": isinstance(sampler, DistributedSampler) and sampler.drop_last,
    }


def main(out_dir: str, init_ckpt: str) -> None:
    results = {}
    for strategy in ("ddp", "fsdp2"):
        for data in LIMITS:
            results[(strategy, data)] = evaluate(data, init_ckpt, strategy, devices=2)
    rank = torch.distributed.get_rank()
    torch.save(results, Path(out_dir) / f"eval_shares_rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])

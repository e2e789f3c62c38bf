"""A test-only callback for multi-process jobs: records, per rank and optimizer step, the loss, the
learning rate and a hash of every training window, and after each validation pass (not the sanity check) the
step and the logged ``val/loss``, as JSON lines flushed at once (so a SIGKILL loses nothing already recorded);
optionally kills its own process to simulate a hard stop."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import lightning as L
import torch


class StepRecorder(L.Callback):
    def __init__(self, out_dir: str, kill_at_step: int | None = None, probe_logits: bool = False) -> None:
        self.out_dir, self.kill_at_step, self.probe_logits = Path(out_dir), kill_at_step, probe_logits

    def _write(self, trainer: L.Trainer, record: dict, prefix: str = "") -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"{prefix}rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the checkpoint of the previous step has been written by now (checkpoint callbacks run last)
        if self.kill_at_step is not None and trainer.global_step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rows = [hashlib.sha1(r.cpu().numpy().tobytes()).hexdigest()[:16] for r in batch["input_ids"]]
        self._write(
            trainer,
            {
                "step": trainer.global_step,
                "loss": float(outputs["loss"]),
                "lr": trainer.optimizers[0].param_groups[0]["lr"],
                "rows": rows,
                "num_nodes": trainer.num_nodes,
                "node_rank": trainer.node_rank,
                "world_size": trainer.world_size,
            },
        )

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or "val/loss" not in trainer.callback_metrics:
            return
        loss = float(trainer.callback_metrics["val/loss"])  # synced over the ranks (a torchmetrics mean)
        self._write(trainer, {"step": trainer.global_step, "val_loss": loss}, prefix="val_")

    def on_train_end(self, trainer, pl_module) -> None:
        if not self.probe_logits:
            return
        g = torch.Generator().manual_seed(7)
        idx = torch.randint(0, 64, (2, 16), generator=g).to(pl_module.device)
        with torch.no_grad():
            logits = pl_module.model(idx).float().cpu()  # every rank runs the (sharded) forward
        if trainer.global_rank == 0:
            torch.save({"idx": idx.cpu(), "logits": logits}, self.out_dir / "probe.pt")

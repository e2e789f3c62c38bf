"""Small, fast training fixtures shared by module and callback tests."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from bhyt_pl.data.eval_set import eval_set
from bhyt_pl.module import LlamaLM
from bhyt_pl.run_facts import build_run_facts


class _Windows(Dataset):
    """Deterministic token windows with learnable structure (an arithmetic progression mod vocab)."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        steps = torch.randint(1, 4, (n, 1), generator=g)
        self.windows = (starts + steps * torch.arange(seq_len + 1)) % vocab

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = self.windows[i]
        return {"input_ids": w[:-1], "labels": w[1:]}


class TokenDataModule(L.LightningDataModule):
    """``input_ids``/``labels`` batches, the contract of ``C4DataModule`` without any file."""

    def __init__(self, seq_len: int = 32, batch_size: int = 4, vocab: int = 64, n: int = 64) -> None:
        super().__init__()
        self.seq_len, self.batch_size, self.vocab, self.n = seq_len, batch_size, vocab, n
        self.tokenizer = "embedded"

    def run_facts(self) -> dict[str, int]:
        """The run facts a data module declares (``bhyt_pl.run_config.RunFactsSource``), as C4DataModule does."""
        return build_run_facts(seq_len=self.seq_len, batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        data = _Windows(self.n, self.seq_len, self.vocab, 0)
        if self.trainer is not None and self.trainer.world_size > 1:
            # rank r takes windows r, r + W, ...: with W ranks of batch b, global batch s is exactly the
            # one-process batch s of size W * b (use with Trainer(use_distributed_sampler=False))
            data = Subset(data, range(self.trainer.global_rank, len(data), self.trainer.world_size))
        return DataLoader(data, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        # the data modules' evaluation set: the first limit_val_batches x batch_size windows, window i on rank i mod W
        share = eval_set(self.trainer, "validation", self.batch_size)
        return share.loader(_Windows(16, self.seq_len, self.vocab, 1), batch_size=self.batch_size)


TINY_OVERRIDES = {
    "vocab_size": 64,
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "mlp_dim": 48,
    "max_seq_len": 64,
}


def quiet_trainer(**kwargs) -> L.Trainer:
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_steps=3,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**defaults, **kwargs})


class FailAt(L.Callback):
    """Raises ``RuntimeError("a bug at step N")`` after optimizer step ``step``: an error nobody explains."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"a bug at step {self.step}")


def bhyt_trained_between_refreshes(tmp_path: Path) -> tuple[LlamaLM, Path]:
    """A BHyT ``LlamaLM`` trained 6 steps with its norm constants refreshed every 4, and its checkpoint at step 6:
    the ``c`` in use (and saved) is step 4's, not the one step 6's weights give."""
    from bhyt_pl.callbacks import NormConstantRefresh

    lm = LlamaLM(overrides=TINY_OVERRIDES, norm="bhyt", seq_len=32, lr=3e-2, warmup_steps=0, tokenizer="embedded")
    trainer = quiet_trainer(callbacks=[NormConstantRefresh(every_n_steps=4)], max_steps=6)
    trainer.fit(lm, datamodule=TokenDataModule())
    ckpt = tmp_path / "step6.ckpt"
    trainer.save_checkpoint(ckpt)
    return lm, ckpt

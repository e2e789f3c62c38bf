"""Training throughput (tokens/s, samples/s, FLOP/s), MFU and peak memory, on Lightning's ``ThroughputMonitor``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from typing_extensions import override

from bhyt_pl.callbacks.blocks import BlocksSpec, LocatedBlocks, locate_blocks
from bhyt_pl.flops import training_flops

__all__ = [
    "PEAK_FLOPS",
    "TokenThroughputMonitor",
    "batch_samples",
    "batch_tokens",
    "estimated_training_flops_per_token",
    "peak_flops_for",
]

log = logging.getLogger(__name__)

# Dense (no 2:4 sparsity) tensor-core peaks per GPU, FLOP/s. Lightning's own table lists H200 under names
# the driver does not report ("h200 sxm1"; the driver says "NVIDIA H200"), gives sparse figures for H200
# (2.0e15 bf16) and a two-GPU figure for "H100 NVL", so MFU there would be missing or off by 2x.
# Sources: NVIDIA H100 and H200 datasheets (dense = half the "with sparsity" figures).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    # matched in this order against the lower-cased device name
    "h200 nvl": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12, "fp64": 30e12},
    "h200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12, "fp64": 34e12},
    "h100 nvl": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12, "fp64": 30e12},
    "h100 pcie": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12, "fp64": 25.6e12},
    "h100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12, "fp64": 34e12},
    "a100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12, "fp64": 9.7e12},
}

_DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def peak_flops_for(device_name: str, dtype: torch.dtype, tf32: bool | None = None) -> float | None:
    """Dense peak FLOP/s of one GPU from ``PEAK_FLOPS``, or None when the device or dtype is not listed.

    Args:
        device_name: e.g. ``torch.cuda.get_device_name()``, ``"NVIDIA H200"``.
        dtype: the compute dtype of the matmuls.
        tf32: float32 matmuls run as TF32; default: ``torch.get_float32_matmul_precision() != "highest"``.

    Example:
        >>> peak_flops_for("NVIDIA H200", torch.bfloat16)
        989000000000000.0
    """
    key = _DTYPE_KEYS.get(dtype)
    if key == "fp32" and (tf32 if tf32 is not None else torch.get_float32_matmul_precision() != "highest"):
        key = "tf32"
    name = device_name.lower()
    for chip, table in PEAK_FLOPS.items():
        if chip in name:
            return table.get(key) if key else None
    return None


def _input_ids(batch: Any) -> torch.Tensor:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return batch["input_ids"]
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    raise TypeError(
        "TokenThroughputMonitor counts tokens in a dict with 'input_ids', a tensor [B, T] or a tuple starting with "
        f"one; got {type(batch).__name__}: pass batch_size_fn and length_fn"
    )


def batch_samples(batch: Any) -> int:
    """Sequences in a batch: ``input_ids`` [B, T] of a dict, a tensor, or a tuple's first tensor (the default
    ``batch_size_fn``)."""
    return int(_input_ids(batch).shape[0])


def batch_tokens(batch: Any) -> int:
    """Tokens processed in a batch, padding included (the default ``length_fn``; batches as ``batch_samples``)."""
    return int(_input_ids(batch).numel())


def estimated_training_flops_per_token(located: LocatedBlocks, seq_len: int) -> float:
    """Matmul FLOPs of one training token of any decoder, from its blocks (forward + backward = 3x forward).

    ``bhyt_pl.flops.training_flops`` with the weights of every matrix in the blocks and of the output
    projection (``get_output_embeddings()`` or ``lm_head``) and, per block, the attention width ``H * hd``
    from the query projection (else the hidden width). Embedding lookups, norms and element-wise work are
    not counted.
    """
    matmul = sum(p.numel() for block in located for p in block.parameters() if p.ndim >= 2)
    owner = located.owner
    head = owner.get_output_embeddings() if callable(getattr(owner, "get_output_embeddings", None)) else None
    head = head if head is not None else getattr(owner, "lm_head", None)
    if isinstance(head, nn.Module):
        matmul += sum(p.numel() for p in head.parameters() if p.ndim >= 2)
    width = 0
    for i, block in enumerate(located):
        qk = located.qk_projections(i)
        width += (
            qk.q.out_features if qk is not None else next((p.shape[-1] for p in block.parameters() if p.ndim >= 2), 0)
        )
    return training_flops(matmul, width, seq_len)


class _FlopsSource:
    """What Lightning's ``ThroughputMonitor`` reads from the LightningModule: ``flops_per_batch``."""

    def __init__(self, flops_per_batch: float | None) -> None:
        self.flops_per_batch = flops_per_batch


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


class TokenThroughputMonitor(ThroughputMonitor):
    """Tokens/s, samples/s and FLOP/s per device and global, MFU, and peak memory.

    Subclasses Lightning's ``ThroughputMonitor`` (timing between batches, validation time excluded from
    training time, rank-zero measurement) where it falls short for language models:

    - metric names: Lightning logs ``train/device/items_per_sec`` and adds the global rates only when
      ``world_size > 1``; here every rate is logged under stable names with units (``train/tokens_per_sec``,
      ``train/tokens_per_sec_per_device``, ``train/samples_per_sec``, ``train/flops_per_sec``, ``train/mfu``),
      global = per device x world size, as Lightning computes it;
    - MFU: Lightning's peak table misses H200 under its driver name and has sparse or two-GPU figures
      (see ``PEAK_FLOPS``); here the peak is ``peak_flops`` if given, else ``PEAK_FLOPS``, else Lightning's
      table; with no known peak (CPU) no MFU is logged rather than a wrong one;
    - memory: ``memory/cuda_peak_allocated_gib`` and ``memory/cuda_peak_reserved_gib`` on GPU,
      ``memory/rss_gib`` and ``memory/peak_rss_gib`` of the process on CPU;
    - the progress bar shows ``train/tokens_per_sec``.

    FLOPs come from the LightningModule's ``flops_per_batch`` (``LlamaLM`` updates it every batch), one
    device's batch; a LightningModule without it (your own around a transformers or litgpt model) gets an
    estimate from its transformer blocks (``estimated_training_flops_per_token``, blocks found by
    ``bhyt_pl.callbacks.blocks.locate_blocks`` or the ``blocks`` argument). Rates are averages over the
    last ``window_size`` batches; none is logged before the window fills. Logged every
    ``trainer.log_every_n_steps``, after gradient accumulation.

    Args:
        batch_size_fn: samples in a batch; default ``batch["input_ids"].shape[0]``.
        length_fn: tokens in a batch; default ``batch["input_ids"].numel()``.
        peak_flops: peak FLOP/s of one device for MFU, overriding the table (e.g. ``989e12``).
        window_size: batches in the rolling average (at least 2).
        memory: log memory metrics.
        progress_bar: show tokens/s in the progress bar.
        blocks: where the transformer blocks are, for FLOPs of a module without ``flops_per_batch``: a dotted
            path or a callable (``locate_blocks``); None finds bhyt_pl, transformers and litgpt blocks.

    Example:
        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[TokenThroughputMonitor(peak_flops=989e12)], max_steps=1)
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        peak_flops: float | None = None,
        window_size: int = 20,
        memory: bool = True,
        progress_bar: bool = True,
        blocks: BlocksSpec = None,
    ) -> None:
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(f"peak_flops must be > 0 FLOP/s or None, got {peak_flops}")
        if not (isinstance(window_size, int) and window_size >= 2):
            raise ValueError(f"window_size must be an int >= 2 (rates need two timestamps), got {window_size!r}")
        super().__init__(batch_size_fn or batch_samples, length_fn or batch_tokens, window_size=window_size)
        self.peak_flops = peak_flops
        self.memory = memory
        self.progress_bar = progress_bar
        self.blocks = blocks
        self._located: LocatedBlocks | None | bool = False  # False: not looked for yet
        self.latest: dict[str, float] = {}
        """The metrics of the last logging step (rank 0), for tests and scripts."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        device = trainer.strategy.root_device
        if self.peak_flops is not None:
            peak = self.peak_flops
        elif device.type == "cuda":
            dtype = _plugin_to_compute_dtype(trainer.precision_plugin)
            peak = peak_flops_for(torch.cuda.get_device_name(device), dtype) or self.available_flops
        else:
            peak = None  # no trustworthy peak for CPUs: no MFU (style practice 14)
        if peak is None:
            rank_zero_info(f"TokenThroughputMonitor: no peak FLOP/s for {device}; MFU is not logged (set peak_flops)")
        self.available_flops = peak
        for throughput in self._throughputs.values():  # built by the parent with Lightning's table
            throughput.available_flops = peak

    @override
    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        if hasattr(pl_module, "flops_per_batch"):
            return super()._update(trainer, pl_module, batch, iter_num)
        super()._update(trainer, _FlopsSource(self._estimate_flops(pl_module, batch)), batch, iter_num)

    def _estimate_flops(self, pl_module: L.LightningModule, batch: Any) -> float | None:
        """FLOPs of one device's batch from the located blocks (None when there are none)."""
        if self._located is False:
            try:
                self._located = locate_blocks(pl_module, self.blocks)
                rank_zero_info(
                    f"TokenThroughputMonitor: {type(pl_module).__name__} has no flops_per_batch; FLOPs are estimated "
                    f"from the {len(self._located)} blocks at {self._located.path}"
                )
            except ValueError as err:
                if self.blocks is not None:
                    raise
                self._located = None
                rank_zero_info(f"TokenThroughputMonitor: no FLOPs and no MFU ({err})")
        if self._located is None:
            return None
        samples, tokens = self.batch_size_fn(batch), self.length_fn(batch)
        seq_len = max(1, tokens // max(1, samples))
        return tokens * estimated_training_flops_per_token(self._located, seq_len)

    # Lightning's ``_compute`` names and filters the metrics; this override renames them and adds memory.
    # It writes through the same logger connector as the parent, so steps match Lightning's other metrics.
    @override
    def _compute(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        if not trainer._logger_connector.should_update_logs:
            return
        stage = trainer.state.stage
        throughput = self._throughputs[stage]
        prefix = "train" if stage == RunningStage.TRAINING else stage.value
        metrics = self.rename(throughput.compute(), prefix, throughput.world_size)
        if self.memory:
            metrics.update(self.memory_metrics(trainer.strategy.root_device))
        self.latest = metrics
        # against the global step like every other curve: Lightning passes the validation batch counter for
        # validation, which made validate/* and memory/* zig-zag, and micro-batches under accumulation
        trainer._logger_connector.log_metrics(metrics, step=trainer.global_step)

    @staticmethod
    def rename(raw: dict[str, float], prefix: str, world_size: int) -> dict[str, float]:
        """Lightning's ``Throughput.compute`` keys to bhyt_pl's names; global rates = per device x world size."""
        out = {f"{prefix}/time_sec": raw["time"], f"{prefix}/samples": raw["samples"]}
        if "lengths" in raw:
            out[f"{prefix}/tokens"] = raw["lengths"]
        per_device = {
            "device/items_per_sec": "tokens_per_sec",
            "device/samples_per_sec": "samples_per_sec",
            "device/batches_per_sec": "batches_per_sec",
            "device/flops_per_sec": "flops_per_sec",
        }
        for key, name in per_device.items():
            if key in raw:
                out[f"{prefix}/{name}_per_device"] = raw[key]
                out[f"{prefix}/{name}"] = raw[key] * world_size
        if "device/mfu" in raw:
            out[f"{prefix}/mfu"] = raw["device/mfu"]
        return out

    @staticmethod
    def memory_metrics(device: torch.device) -> dict[str, float]:
        """Peak CUDA memory of ``device`` (allocated, reserved) or the process's current and peak RSS, GiB."""
        gib = float(2**30)
        if device.type == "cuda":
            return {
                "memory/cuda_peak_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
                "memory/cuda_peak_reserved_gib": torch.cuda.max_memory_reserved(device) / gib,
            }
        import psutil

        out = {"memory/rss_gib": psutil.Process().memory_info().rss / gib}
        peak = _peak_rss_bytes()
        if peak is not None:
            out["memory/peak_rss_gib"] = peak / gib
        return out

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)
        tokens_per_sec = self.latest.get("train/tokens_per_sec")
        if self.progress_bar and tokens_per_sec is not None and trainer.is_global_zero:
            # measured on rank 0 only (as the parent does), hence rank_zero_only and no sync
            pl_module.log("train/tokens_per_sec", tokens_per_sec, prog_bar=True, logger=False, rank_zero_only=True)

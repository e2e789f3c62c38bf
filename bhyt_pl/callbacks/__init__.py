"""Lightning callbacks: depth-wise activation statistics (each declared once in ``layer_stats``), stability
(gradients, attention entropy, outliers, spikes by depth), throughput/MFU/memory, norm-constant refresh, the
checkpoint callback that loses no work, the run's log file, the validation pass at a fit's last step, and the
step progress bar.

The statistics and throughput callbacks work inside any LightningModule: ``locate_blocks`` finds the
transformer blocks of bhyt_pl, transformers and litgpt models (or takes a ``blocks`` argument).

YAML presets that append each of them to any recipe live in the top-level ``callbacks/`` directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bhyt_pl.lazy import lazy_exports

__all__ = [
    "PEAK_FLOPS",
    "SITES",
    "DepthStatsCollector",
    "DepthStatsMonitor",
    "LayerMetrics",
    "LayerStatistic",
    "LocatedBlocks",
    "NormConstantRefresh",
    "RunCheckpoint",
    "RunLogFile",
    "StepProgressBar",
    "QKProjections",
    "SpikeDetector",
    "StabilityMonitor",
    "Summary",
    "TokenThroughputMonitor",
    "ValidateAtLastStep",
    "batch_samples",
    "batch_tokens",
    "causal_attention_entropy",
    "default_refresh_interval",
    "depth_figures",
    "estimated_training_flops_per_token",
    "final_validation_callbacks",
    "layer_key",
    "layer_series",
    "layer_width",
    "locate_blocks",
    "log_figures",
    "norm_refresh_callbacks",
    "peak_flops_for",
    "register_statistic",
    "split_layer_key",
    "unregister_statistic",
]

_EXPORTS = {
    "causal_attention_entropy": "bhyt_pl.callbacks.attention_entropy",
    "LocatedBlocks": "bhyt_pl.callbacks.blocks",
    "QKProjections": "bhyt_pl.callbacks.blocks",
    "locate_blocks": "bhyt_pl.callbacks.blocks",
    "RunCheckpoint": "bhyt_pl.callbacks.checkpointing",
    "SITES": "bhyt_pl.callbacks.depth_stats",
    "DepthStatsCollector": "bhyt_pl.callbacks.depth_stats",
    "DepthStatsMonitor": "bhyt_pl.callbacks.depth_stats",
    "depth_figures": "bhyt_pl.callbacks.depth_stats",
    "ValidateAtLastStep": "bhyt_pl.callbacks.final_validation",
    "final_validation_callbacks": "bhyt_pl.callbacks.final_validation",
    "LayerMetrics": "bhyt_pl.callbacks.layer_metrics",
    "layer_key": "bhyt_pl.callbacks.layer_metrics",
    "layer_series": "bhyt_pl.callbacks.layer_metrics",
    "layer_width": "bhyt_pl.callbacks.layer_metrics",
    "split_layer_key": "bhyt_pl.callbacks.layer_metrics",
    "LayerStatistic": "bhyt_pl.callbacks.layer_stats",
    "Summary": "bhyt_pl.callbacks.layer_stats",
    "register_statistic": "bhyt_pl.callbacks.layer_stats",
    "unregister_statistic": "bhyt_pl.callbacks.layer_stats",
    "log_figures": "bhyt_pl.callbacks.loggers",
    "NormConstantRefresh": "bhyt_pl.callbacks.norm_refresh",
    "default_refresh_interval": "bhyt_pl.callbacks.norm_refresh",
    "norm_refresh_callbacks": "bhyt_pl.callbacks.norm_refresh",
    "StepProgressBar": "bhyt_pl.callbacks.progress",
    "RunLogFile": "bhyt_pl.callbacks.run_log",
    "SpikeDetector": "bhyt_pl.callbacks.stability",
    "StabilityMonitor": "bhyt_pl.callbacks.stability",
    "PEAK_FLOPS": "bhyt_pl.callbacks.throughput",
    "TokenThroughputMonitor": "bhyt_pl.callbacks.throughput",
    "batch_samples": "bhyt_pl.callbacks.throughput",
    "batch_tokens": "bhyt_pl.callbacks.throughput",
    "estimated_training_flops_per_token": "bhyt_pl.callbacks.throughput",
    "peak_flops_for": "bhyt_pl.callbacks.throughput",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names as static tools see them; at run time each loads on first use
    from bhyt_pl.callbacks.attention_entropy import causal_attention_entropy
    from bhyt_pl.callbacks.blocks import LocatedBlocks, QKProjections, locate_blocks
    from bhyt_pl.callbacks.checkpointing import RunCheckpoint
    from bhyt_pl.callbacks.depth_stats import SITES, DepthStatsCollector, DepthStatsMonitor, depth_figures
    from bhyt_pl.callbacks.final_validation import ValidateAtLastStep, final_validation_callbacks
    from bhyt_pl.callbacks.layer_metrics import LayerMetrics, layer_key, layer_series, layer_width, split_layer_key
    from bhyt_pl.callbacks.layer_stats import LayerStatistic, Summary, register_statistic, unregister_statistic
    from bhyt_pl.callbacks.loggers import log_figures
    from bhyt_pl.callbacks.norm_refresh import NormConstantRefresh, default_refresh_interval, norm_refresh_callbacks
    from bhyt_pl.callbacks.progress import StepProgressBar
    from bhyt_pl.callbacks.run_log import RunLogFile
    from bhyt_pl.callbacks.stability import SpikeDetector, StabilityMonitor
    from bhyt_pl.callbacks.throughput import (
        PEAK_FLOPS,
        TokenThroughputMonitor,
        batch_samples,
        batch_tokens,
        estimated_training_flops_per_token,
        peak_flops_for,
    )

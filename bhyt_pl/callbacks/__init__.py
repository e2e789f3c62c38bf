"""Lightning callbacks: depth-wise activation statistics, stability (gradients, attention entropy, outliers,
spikes by depth), throughput/MFU/memory, norm-constant refresh.

YAML presets that append each of them to any recipe live in the top-level ``callbacks/`` directory.
"""

from bhyt_pl.callbacks.depth_stats import SITES, DepthStatsCollector, DepthStatsMonitor, depth_figures
from bhyt_pl.callbacks.norm_refresh import NormConstantRefresh, default_refresh_interval, norm_refresh_callbacks
from bhyt_pl.callbacks.stability import SpikeDetector, StabilityMonitor
from bhyt_pl.callbacks.throughput import (
    PEAK_FLOPS,
    TokenThroughputMonitor,
    batch_samples,
    batch_tokens,
    peak_flops_for,
)

__all__ = [
    "PEAK_FLOPS",
    "SITES",
    "DepthStatsCollector",
    "DepthStatsMonitor",
    "NormConstantRefresh",
    "SpikeDetector",
    "StabilityMonitor",
    "TokenThroughputMonitor",
    "batch_samples",
    "batch_tokens",
    "default_refresh_interval",
    "depth_figures",
    "norm_refresh_callbacks",
    "peak_flops_for",
]

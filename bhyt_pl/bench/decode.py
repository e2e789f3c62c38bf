"""Whole greedy ``generate`` calls (prefill included, as a user sees them) of ours compiled, ours eager
and transformers at several model sizes, and where the time goes.

``profile_generate`` runs one call under ``torch.profiler`` and sums the self CPU time of its operators
into matrix multiplies (the weights every decoded token must stream), attention (SDPA and its
kernels) and everything else (Python, dispatch, dynamo's guards, elementwise kernels, sampling), as
fractions of the call's wall time under the profiler. The matmul time bounds the ratio: a side that
did nothing but its matrix multiplies would take its matmul fraction of its median call, so ours can
be at most ``t_transformers / (matmul_fraction(ours) * t_ours)`` times faster than transformers.
Inductor lowers SDPA into its own kernels, so compiled attention counts as ``other``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile

__all__ = ["CATEGORIES", "parse_size", "profile_generate"]

CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn", "aten::_mkl_linear"),
    "attention": ("scaled_dot_product", "flash_attention", "_efficient_attention", "aten::_safe_softmax"),
}
"""Operator-name substrings of each category; the rest is ``other``. Only leaf ATen calls are counted
(self time), so a matmul inside ``aten::linear`` counts once."""


def parse_size(text: str) -> tuple[str, dict[str, int]]:
    """``"llama-374m:2"`` -> ``("llama-374m", {"n_layers": 2})``; ``"tiny"`` -> ``("tiny", {})``."""
    preset, _, layers = text.partition(":")
    if layers and not layers.isdigit():
        raise ValueError(f"--decode-sizes: {text!r} must be preset or preset:n_layers, e.g. llama-374m:2")
    return preset, ({"n_layers": int(layers)} if layers else {})


def _category(name: str) -> str:
    for category, keys in CATEGORIES.items():
        if any(k in name for k in keys):
            return category
    return "other"


def profile_generate(generate: Callable[[], object]) -> dict[str, Any]:
    """Seconds of one profiled ``generate()`` call by category (see the module docstring)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        generate()
        wall = time.perf_counter() - start
    seconds = {"matmul": 0.0, "attention": 0.0}
    for event in prof.key_averages():
        category = _category(event.key)
        if category != "other":
            seconds[category] += event.self_cpu_time_total / 1e6
    seconds["other"] = max(0.0, wall - seconds["matmul"] - seconds["attention"])
    return {
        "wall_s": wall,
        **{f"{k}_s": v for k, v in seconds.items()},
        **{f"{k}_fraction": v / wall for k, v in seconds.items()},
    }

"""Interleaved repetitions and medians: the only timing primitive of the benchmark.

On a shared CPU, run-to-run drift is larger than the differences between norm schemes, so every
comparison is made inside one run: each repetition times every candidate once, in a rotated order,
and a candidate's figure is the median of its repetitions. Ratios are quotients of medians, or, with
``paired_ratio``, the median of the per-repetition ratios with an interval.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["interleaved", "median", "paired_ratio", "synchronizer"]


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def interleaved(
    candidates: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Seconds per call of each candidate, ``repeats`` samples each, interleaved.

    Repetition ``r`` starts at candidate ``r mod n`` so that no candidate always runs first (after
    another one has warmed, or polluted, the caches). The garbage collector is off while timing.

    Args:
        candidates: name -> a callable doing one unit of work.
        repeats: samples per candidate.
        warmup: untimed calls of each candidate first (compilation, allocator warm-up).
        sync: called before reading the clock (``torch.cuda.synchronize`` on GPU).

    Returns:
        name -> list of ``repeats`` durations in seconds.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(candidates)
    for _ in range(warmup):
        for name in names:
            candidates[name]()
    sync()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                sync()
                start = time.perf_counter()
                candidates[name]()
                sync()
                samples[name].append(time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def paired_ratio(numerator: list[float], denominator: list[float], level: float = 0.95) -> dict[str, float]:
    """Median of the per-repetition ratios ``numerator[r] / denominator[r]`` (the two candidates timed in
    the same repetition of ``interleaved``) with a distribution-free interval for that median.

    The interval is ``[r_(k), r_(n+1-k)]`` of the sorted ratios, the widest order statistics whose
    binomial coverage ``1 - 2 P(Bin(n, 1/2) < k)`` is at least ``level`` (at level 0.95, up to 8
    repetitions it is the range, covering ``1 - 2^(1-n)``). Returns ``{"median", "low", "high", "coverage", "n"}``.
    """
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(f"need paired samples of equal, nonzero length; got {len(numerator)} and {len(denominator)}")
    ratios = sorted(a / b for a, b in zip(numerator, denominator))
    n = len(ratios)
    tail, k = 0.0, 0  # tail = P(Bin(n, 1/2) < k)
    while k < n // 2 and 1 - 2 * (tail + math.comb(n, k) / 2**n) >= level:
        tail += math.comb(n, k) / 2**n
        k += 1
    k = max(k, 1)
    coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
    return {
        "median": statistics.median(ratios),
        "low": ratios[k - 1],
        "high": ratios[n - k],
        "coverage": coverage,
        "n": n,
    }

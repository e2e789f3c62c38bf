"""tanh formulations on the CPU: time and largest relative error against float64 tanh.

Inductor writes ``torch.tanh`` as a call it does not vectorise well on CPU, so the formulation,
not the arithmetic, decides a tanh-based site's cost there. BHyT's fused path uses
``rational_tanh``; the others are listed to show why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bhyt_pl.bench.timing import interleaved, median
from bhyt_pl.norms.bhyt_kernels import rational_tanh

__all__ = ["FORMULATIONS", "max_relative_error", "tanh_table"]


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    return 2 * torch.sigmoid(2 * z) - 1  # loses relative accuracy near 0


def _expm1(z: torch.Tensor) -> torch.Tensor:
    e = torch.expm1(-2 * z.abs())
    return torch.copysign(-e / (2 + e), z)


FORMULATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.tanh": torch.tanh,
    "2*sigmoid(2z)-1": _sigmoid,
    "expm1": _expm1,
    "rational [13/6]": rational_tanh,
}


def dense_grid() -> torch.Tensor:
    """float32 points covering the real line: a fine linear grid on [-30, 30] and +-logspace(-30, 2)."""
    lin = torch.linspace(-30, 30, 1_200_001)
    logs = torch.logspace(-30, 2, 200_001)
    return torch.cat([lin, logs, -logs, torch.tensor([0.0, 1e30, -1e30, float("inf"), -float("inf")])])


def max_relative_error(f: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor) -> float:
    """max |f(z) - tanh(z)| / |tanh(z)| with the exact tanh in float64 (0/0 counts as 0)."""
    exact = torch.tanh(z.double())
    err = (f(z).double() - exact).abs() / exact.abs()
    return float(torch.nan_to_num(err, nan=0.0).max())


def tanh_table(shape: tuple[int, ...], repeats: int, compile: bool) -> dict[str, dict[str, float]]:
    """Per formulation: forward time on a float32 ``shape`` tensor (eager, and compiled if asked)
    and the max relative error over ``dense_grid``."""
    x = torch.randn(shape)
    grid = dense_grid()
    result = {name: {"max_rel_error": max_relative_error(f, grid)} for name, f in FORMULATIONS.items()}
    modes = {"eager": False, "compiled": True} if compile else {"eager": False}
    for mode, use_compile in modes.items():
        fns = {n: (torch.compile(f, dynamic=False) if use_compile else f) for n, f in FORMULATIONS.items()}
        samples = interleaved({n: (lambda f=f: f(x)) for n, f in fns.items()}, repeats, warmup=2)
        for name, s in samples.items():
            result[name][f"{mode}_ms"] = median(s) * 1e3
    return result

"""Lightning callbacks: norm-constant refresh (and, in their own modules, diagnostics)."""

from bhyt_pl.callbacks.norm_refresh import NormConstantRefresh, default_refresh_interval

__all__ = ["NormConstantRefresh", "default_refresh_interval"]

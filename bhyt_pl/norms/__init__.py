"""Normalization schemes: an open registry of per-block norms (docs/method.md, sections 2-4).

Importing this package registers the built-in schemes: ``rmsnorm``, ``layernorm``, ``dyt``,
``bhyt``, ``bhyt_exact``, ``peri_ln`` and ``lns``. Add your own with ``@register_norm``.
"""

from bhyt_pl.norms.base import BlockNorms, NormScheme, build_norm_scheme, register_norm, registered_norms, second_moment
from bhyt_pl.norms.bhyt import (
    BHyT,
    BHyTBlockNorms,
    BHyTExactScheme,
    BHyTScheme,
    SiteStats,
    satisfies_variance_bound,
    vo_constant,
)
from bhyt_pl.norms.dyt import DyT, DyTScheme, EmbeddingScale
from bhyt_pl.norms.layernorm import LayerNorm, LayerNormScheme
from bhyt_pl.norms.lns import LNSScheme
from bhyt_pl.norms.peri_ln import PeriLNScheme
from bhyt_pl.norms.rmsnorm import RMSNorm, RMSNormScheme

__all__ = [
    "BHyT",
    "BHyTBlockNorms",
    "BHyTExactScheme",
    "BHyTScheme",
    "BlockNorms",
    "DyT",
    "DyTScheme",
    "EmbeddingScale",
    "LNSScheme",
    "LayerNorm",
    "LayerNormScheme",
    "NormScheme",
    "PeriLNScheme",
    "RMSNorm",
    "RMSNormScheme",
    "SiteStats",
    "build_norm_scheme",
    "register_norm",
    "registered_norms",
    "satisfies_variance_bound",
    "second_moment",
    "vo_constant",
]

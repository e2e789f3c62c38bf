"""Normalization schemes: an open registry of per-block norms (docs/method.md, sections 2-4).

Importing this package imports every module in it, so each scheme a module registers with
``@register_norm`` is available (``registered_norms()`` lists them): a new scheme is one new file here.
The classes most users need are re-exported below. Add schemes of your own, anywhere, with ``@register_norm``.
"""

import importlib
import pkgutil

from bhyt_pl.norms.base import (
    QK_NORMS,
    AttentionNorms,
    BlockNorms,
    BoundedSite,
    MLPScales,
    NormScheme,
    Scale,
    build_norm_scheme,
    register_norm,
    registered_norms,
    second_moment,
)
from bhyt_pl.norms.bhyt import (
    BHyT,
    BHyTBlockNorms,
    BHyTExactScheme,
    BHyTScheme,
    SiteStats,
    satisfies_variance_bound,
    vo_constant,
)
from bhyt_pl.norms.derf import Derf, DerfScheme
from bhyt_pl.norms.dyisru import DyISRU, DyISRUScheme
from bhyt_pl.norms.dyt import DyT, DyTScheme, EmbeddingScale
from bhyt_pl.norms.gpas import GPASBlockNorms, GPASScheme
from bhyt_pl.norms.hybridnorm import HybridNormScheme
from bhyt_pl.norms.layernorm import LayerNorm, LayerNormScheme
from bhyt_pl.norms.lns import LNSScheme
from bhyt_pl.norms.mix_ln import MixLNScheme
from bhyt_pl.norms.ngpt import L2Norm, NGPTBlockNorms, NGPTScheme
from bhyt_pl.norms.peri_ln import PeriLNScheme
from bhyt_pl.norms.post_ln import PostLNScheme
from bhyt_pl.norms.reordered import ReorderedNormScheme
from bhyt_pl.norms.rmsnorm import RMSNorm, RMSNormScheme
from bhyt_pl.norms.seednorm import SeeDNorm, SeeDNormScheme
from bhyt_pl.norms.ssnorm import SSNorm, SSNormScheme

__all__ = [
    "QK_NORMS",
    "AttentionNorms",
    "BHyT",
    "BHyTBlockNorms",
    "BHyTExactScheme",
    "BHyTScheme",
    "BlockNorms",
    "BoundedSite",
    "Derf",
    "DerfScheme",
    "DyISRU",
    "DyISRUScheme",
    "DyT",
    "DyTScheme",
    "EmbeddingScale",
    "GPASBlockNorms",
    "GPASScheme",
    "HybridNormScheme",
    "L2Norm",
    "LNSScheme",
    "LayerNorm",
    "LayerNormScheme",
    "MLPScales",
    "MixLNScheme",
    "NGPTBlockNorms",
    "NGPTScheme",
    "NormScheme",
    "PeriLNScheme",
    "PostLNScheme",
    "RMSNorm",
    "ReorderedNormScheme",
    "RMSNormScheme",
    "SeeDNorm",
    "SeeDNormScheme",
    "SSNorm",
    "SSNormScheme",
    "Scale",
    "SiteStats",
    "build_norm_scheme",
    "register_norm",
    "registered_norms",
    "satisfies_variance_bound",
    "second_moment",
    "vo_constant",
]

# every scheme module registers itself on import; importing them all here means a new scheme file needs no
# edit in this one
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
del _module

"""bhyt_pl: BHyT (Bounded Hyperbolic Tanh) and its normalization baselines for Llama, on Lightning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bhyt_pl._version import __version__ as __version__
from bhyt_pl.lazy import lazy_exports

__all__ = [
    "PRESETS",
    "KVCache",
    "Llama",
    "LlamaConfig",
    "LlamaLM",
    "LoadedModel",
    "NormScheme",
    "build_norm_scheme",
    "load_model",
    "parameter_groups",
    "register_norm",
    "registered_norms",
]

_EXPORTS = {
    "LoadedModel": "bhyt_pl.checkpoint",
    "load_model": "bhyt_pl.checkpoint",
    "PRESETS": "bhyt_pl.config",
    "LlamaConfig": "bhyt_pl.config",
    "KVCache": "bhyt_pl.model",
    "Llama": "bhyt_pl.model",
    "LlamaLM": "bhyt_pl.module",
    "NormScheme": "bhyt_pl.norms",
    "build_norm_scheme": "bhyt_pl.norms",
    "register_norm": "bhyt_pl.norms",
    "registered_norms": "bhyt_pl.norms",
    "parameter_groups": "bhyt_pl.optim",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names as static tools see them; at run time each loads on first use
    from bhyt_pl.checkpoint import LoadedModel, load_model
    from bhyt_pl.config import PRESETS, LlamaConfig
    from bhyt_pl.model import KVCache, Llama
    from bhyt_pl.module import LlamaLM
    from bhyt_pl.norms import NormScheme, build_norm_scheme, register_norm, registered_norms
    from bhyt_pl.optim import parameter_groups

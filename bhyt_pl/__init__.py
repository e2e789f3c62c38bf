"""bhyt_pl: BHyT (Bounded Hyperbolic Tanh) and its normalization baselines for Llama, on Lightning."""

from bhyt_pl._version import __version__ as __version__
from bhyt_pl.checkpoint import LoadedModel, load_model
from bhyt_pl.config import PRESETS, LlamaConfig
from bhyt_pl.model import KVCache, Llama
from bhyt_pl.module import LlamaLM
from bhyt_pl.norms import NormScheme, build_norm_scheme, register_norm, registered_norms
from bhyt_pl.optim import parameter_groups

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

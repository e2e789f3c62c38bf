"""Parallelism in one place, apart from the model (as torchtitan's ``parallelize.py``): FSDP2 sharding,
and gathering full weights from FSDP2 or FSDP1 shards for code that needs whole matrices (BHyT's ``c``)
or loads a full state dict into a sharded model.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from bhyt_pl.model import Llama

__all__ = ["full_weights", "is_dtensor_sharded", "load_full_state_dict", "shard_model"]


def shard_model(
    model: Llama,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> Llama:
    """FSDP2: ``fully_shard`` every block, then the root (embeddings, final norm, tied output).

    Call it after ``torch.compile`` of the blocks and before materialising a meta-device model
    (torchtitan's order: compile, shard, ``to_empty``, init). ``param_dtype``/``reduce_dtype`` set the
    mixed-precision policy (e.g. bf16 compute copies with float32 gradient reduction); None keeps the
    parameters' dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full_weights(module: nn.Module) -> AbstractContextManager:
    """A context in which FSDP1 modules expose their full, unflattened weights (a collective: every rank
    enters it on the same steps). FSDP2 and unsharded modules need nothing: use ``bhyt_pl.tensors.full_tensor``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
        return FullyShardedDataParallel.summon_full_params(module, writeback=False, recurse=True)
    return nullcontext()


def is_dtensor_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 DTensors."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load an unsharded state dict into ``model``, sharded with FSDP2 or not (each rank keeps its shard)."""
    if is_dtensor_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))
    else:
        model.load_state_dict(state, strict=strict)

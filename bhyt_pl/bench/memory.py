"""Activation memory: bytes autograd saves for backward, counted exactly with saved-tensor hooks.

Each storage is counted once (a tensor saved by two ops costs its memory once) and parameters
are not activations, so their storages are left out. Device-independent, and deterministic,
unlike an allocator's peak on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["saved_activation_bytes"]


def saved_activation_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages saved for backward while ``fn()`` runs, minus ``exclude``'s.

    Saved tensors stay referenced until ``fn``'s result is dropped, so the count is the activation
    memory held at the end of the forward pass: the peak of a training step before backward starts.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr != 0:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())

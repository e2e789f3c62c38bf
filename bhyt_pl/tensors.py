"""Tensor helpers every layer may use: whole tensors from FSDP2 (DTensor) shards.

Below the norms and the model, so that a norm site that needs whole weight matrices (BHyT's ``c``)
gathers them without importing the parallelism module, which sits above the model.
"""

from __future__ import annotations

import torch

__all__ = ["full_tensor"]


def full_tensor(w: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a possibly FSDP2-sharded (DTensor) parameter; every rank gets the same.
    A plain tensor is returned as is (single process, DDP, or FSDP1 inside ``full_weights``)."""
    gather = getattr(w, "full_tensor", None)
    return gather() if callable(gather) else w

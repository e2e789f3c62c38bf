"""The training FLOPs formula, once: for a ``LlamaConfig`` (``LlamaLM``'s MFU) and for any decoder's blocks
(``TokenThroughputMonitor``'s estimate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bhyt_pl.model_size import block_params

if TYPE_CHECKING:
    from bhyt_pl.config import LlamaConfig

__all__ = ["training_flops", "training_flops_per_token"]


def training_flops(matmul_params: int, attention_width: int, seq_len: int) -> float:
    """Matmul FLOPs of one training token (forward + backward = 3x forward).

    Forward per token: ``2 * matmul_params`` (every matrix of the blocks and the output projection) plus
    attention scores and values, ``2 * 2 * attention_width * T`` where ``attention_width`` is the sum over
    layers of ``H * hd`` (full, not causal-halved, as ``torch.utils.flop_counter`` counts
    ``scaled_dot_product_attention``). Norms and other element-wise work are not counted (MFU convention).
    """
    return 3.0 * (2.0 * matmul_params + 2 * 2 * attention_width * seq_len)


def training_flops_per_token(config: LlamaConfig, seq_len: int) -> float:
    """``training_flops`` of a ``LlamaConfig``: its block matrices (P, ``bhyt_pl.model_size.block_params``) and
    output projection (embedding lookups are free), and ``L * H * hd`` of attention width."""
    c = config
    matmul_params = block_params(c) + c.vocab_size * c.dim  # the output projection, tied or not
    return training_flops(matmul_params, c.n_layers * c.n_heads * c.head_dim, seq_len)

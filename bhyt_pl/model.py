"""A Llama-3.2-style decoder whose norms come from the registry, read top to bottom:
RoPE, the KV cache, attention, the SwiGLU MLP, the block, the model, generation.

Shapes: B batch, T new tokens, S cached + new tokens, H query heads, K key/value heads,
hd head width, d hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bhyt_pl.config import LlamaConfig
from bhyt_pl.init import init_weights
from bhyt_pl.norms import BlockNorms, NormScheme

__all__ = ["Attention", "Block", "KVCache", "Llama", "MLP", "apply_rope", "rope_cos_sin"]


# ----------------------------------------------------------------------------- RoPE
def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for ``positions`` [T], each [T, hd], computed in at least float32 (never cached
    in a buffer, so a ``.to(bfloat16)`` of the model cannot degrade them) and cast to ``dtype``."""
    compute = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=compute) / head_dim))
    freqs = torch.outer(positions.to(compute), inv_freq)  # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd], the half-split layout of HF Llama
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, h, T, hd] by the tables [T, hd] (``rotate_half`` convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


# ----------------------------------------------------------------------------- KV cache
@dataclass
class KVCache:
    """Preallocated keys and values of every layer, each [B, K, max_len, hd].

    Passed explicitly to ``Llama.forward`` (the model keeps no decoding state of its own).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` [B, K, T, hd] at positions ``start:start+T``; return all of ``0:start+T``."""
        end = start + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


# ----------------------------------------------------------------------------- attention and MLP
class Attention(nn.Module):
    """Causal grouped-query self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.dim, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.dim, bias=False)

    def qk(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries [B, H, T, hd] and keys [B, K, T, hd] of ``x`` [B, T, d], exactly as ``forward``
        computes them (StabilityMonitor recomputes them from here for the attention entropy)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, K, T, hd]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k = self.qk(x, cos, sin)  # [B, H, T, hd], [B, K, T, hd]
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # [B, K, T, hd]
        mask, causal = None, True
        if cache is not None:
            k, v = cache.update(self.layer_idx, start_pos, k, v)  # [B, K, S, hd], S = start_pos + T
            if start_pos > 0:
                causal = False
                if T > 1:  # a chunk after a prefix: token t sees keys 0 .. start_pos + t
                    S = k.shape[2]
                    mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_head != self.n_kv_head
        )  # [B, H, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.mlp_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.mlp_dim, bias=False)
        self.down_proj = nn.Linear(config.mlp_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------- block
class Block(nn.Module):
    """One decoder block with a single code path for every norm scheme: the scheme's
    ``BlockNorms`` decide what happens at each site; the block never looks at the scheme's name."""

    def __init__(self, config: LlamaConfig, layer_idx: int, scheme: NormScheme) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.norms: BlockNorms = scheme.block_norms(config.dim, layer_idx, config.n_layers)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        # x: [B, T, d]; residual adds are out of place (FSDP2 and autograd friendly)
        u, ctx = self.norms.pre_attn(x)  # site A
        h = x + self.norms.post_attn(self.attn(u, cos, sin, cache, start_pos))
        v = self.norms.pre_mlp(h, ctx)  # site B, may reuse site A's statistic
        return h + self.norms.post_mlp(self.mlp(v))

    def refresh_norm_constants(self) -> None:
        self.norms.refresh_constants(self.attn)


# ----------------------------------------------------------------------------- model
class Llama(nn.Module):
    """The decoder. Build it from a config (``Llama(LlamaConfig.from_name("tiny", norm="bhyt"))``).

    Weight-derived norm constants (BHyT's ``c``) are recomputed after ``reset_parameters`` and after
    every ``load_state_dict`` (a post-load hook), so a saved value is never trusted.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        scheme = config.norm_scheme()
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.emb_norm = scheme.embedding_norm(config.dim)
        self.layers = nn.ModuleList(Block(config, i, scheme) for i in range(config.n_layers))
        self.final_norm = scheme.final_norm(config.dim, config.n_layers)
        # tied: the output projection reads ``embed.weight`` directly instead of sharing a Parameter
        # between two modules, which meta-device materialisation (``to_empty``) would silently untie
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        self.activation_checkpointing = False
        """Recompute each block in backward while training (set by the trainer; not architecture)."""
        self.register_load_state_dict_post_hook(_refresh_after_load)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)initialise every weight with the init policy, then refresh the norm constants."""
        init_weights(self, self.config.init_std)
        self.refresh_norm_constants()

    def refresh_norm_constants(self) -> None:
        """Recompute cached, weight-derived norm constants (BHyT's ``c``) from the current weights."""
        for layer in self.layers:
            layer.refresh_norm_constants()

    # alias under the name the spec uses
    refresh_bhyt_constants = refresh_norm_constants

    def rope(self, start_pos: int, length: int, device: torch.device, dtype: torch.dtype):
        positions = torch.arange(start_pos, start_pos + length, device=device)
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        """Logits [B, T, V], in the parameters' dtype, for token ids ``idx`` [B, T].

        With ``cache``, ``idx`` holds the tokens at positions ``start_pos:start_pos+T`` and attends
        to the cached prefix as well.
        """
        B, T = idx.shape
        if start_pos + T > self.config.max_seq_len:
            raise ValueError(
                f"sequence of {start_pos + T} tokens exceeds max_seq_len={self.config.max_seq_len}; "
                "raise LlamaConfig.max_seq_len"
            )
        x = self.emb_norm(self.embed(idx))  # [B, T, d]
        cos, sin = self.rope(start_pos, T, idx.device, x.dtype)
        for layer in self.layers:
            if self.activation_checkpointing and self.training and cache is None and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin, cache, start_pos)
        return self.output(self.final_norm(x))

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """Output projection [..., d] -> [..., V] (the embedding matrix when tied)."""
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.embed.weight)

    # ------------------------------------------------------------------------- generation
    def new_kv_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` tokens."""
        max_len = max_len or self.config.max_seq_len
        w = self.embed.weight
        shape = (batch_size, self.config.n_kv_heads, max_len, self.config.head_dim)
        n = self.config.n_layers
        make = lambda: torch.zeros(shape, device=w.device, dtype=dtype or w.dtype)  # noqa: E731
        return KVCache([make() for _ in range(n)], [make() for _ in range(n)])

    @torch.inference_mode()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``prompt`` [B, T0] by up to ``max_new_tokens`` tokens with a KV cache.

        Args:
            prompt: token ids, the same length for every row.
            max_new_tokens: most tokens to add.
            temperature: 0 for greedy decoding, else the softmax temperature of sampling.
            top_k: sample only among the ``top_k`` most likely tokens.
            eos_id: a row stops at this token (it is kept; later positions repeat it); generation
                ends when every row has stopped.
            generator: random generator for reproducible sampling.

        Returns:
            [B, T0 + n] token ids, ``n <= max_new_tokens``.
        """
        if prompt.ndim != 2 or prompt.shape[1] == 0:
            raise ValueError(f"prompt must be [batch, length>0] token ids, got shape {tuple(prompt.shape)}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        B, T0 = prompt.shape
        total = min(T0 + max_new_tokens, self.config.max_seq_len)
        cache = self.new_kv_cache(B, total)
        tokens = prompt
        done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
        logits = self(prompt, cache, 0)[:, -1]  # prefill, [B, V]
        for pos in range(T0, total):
            nxt = _sample(logits.float(), temperature, top_k, generator)  # [B]
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                done = done | (nxt == eos_id)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if (eos_id is not None and bool(done.all())) or pos + 1 == total:
                break
            logits = self(nxt[:, None], cache, pos)[:, -1]  # decode one token
        return tokens


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None):
    """Next token per row from logits [B, V]: argmax at temperature 0, else (top-k) sampling."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _refresh_after_load(module: nn.Module, incompatible_keys) -> None:
    # a state dict never carries ``c`` (non-persistent); recompute it from the loaded weights
    module.refresh_norm_constants()

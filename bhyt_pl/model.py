"""A Llama-3.2-style decoder whose norms come from the registry, read top to bottom:
RoPE, the KV cache, attention, the SwiGLU MLP, the block, the model, generation.

Shapes: B batch, T new tokens, S cached + new tokens, H query heads, K key/value heads,
hd head width, d hidden size, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bhyt_pl.config import LlamaConfig
from bhyt_pl.init import init_weights
from bhyt_pl.loss import LossOutput, linear_cross_entropy
from bhyt_pl.norms import BlockNorms, NormScheme, Scale

__all__ = [
    "Attention",
    "Block",
    "KVCache",
    "Llama",
    "MLP",
    "apply_rope",
    "prefix_attention_mask",
    "rope_cos_sin",
    "rope_inv_freq",
]


# ----------------------------------------------------------------------------- RoPE
def rope_inv_freq(
    head_dim: int,
    theta: float,
    scaling: dict[str, Any] | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The hd/2 rotary frequencies ``theta^(-2i/hd)``, with Llama 3's frequency scaling when ``scaling``
    is given (``LlamaConfig.rope_scaling``): wavelengths above ``original / low_freq_factor`` are
    divided by ``factor``, below ``original / high_freq_factor`` kept, and smoothly interpolated between
    (Meta's ``apply_scaling``, as Hugging Face's ``llama3`` rope type)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim))  # [hd/2]
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)  # 0 at the low-frequency edge, 1 at the high one
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    return torch.where((wavelen >= original / high) & (wavelen <= original / low), interpolated, scaled)


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    dtype: torch.dtype = torch.float32,
    scaling: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for ``positions`` [T], each [T, hd], computed in at least float32 (never cached
    in a buffer, so a ``.to(bfloat16)`` of the model cannot degrade them) and cast to ``dtype``.
    ``scaling`` is ``LlamaConfig.rope_scaling`` (None: plain RoPE)."""
    compute = torch.promote_types(dtype, torch.float32)
    inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device, compute)  # [hd/2]
    freqs = torch.outer(positions.to(compute), inv_freq)  # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd], the half-split layout of HF Llama
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, h, T, hd] by the tables [T, hd] (``rotate_half`` convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


# ----------------------------------------------------------------------------- KV cache
def prefix_attention_mask(start: int, length: int, device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """``(mask, is_causal)`` for ``length`` queries at positions ``start..`` over the keys ``0 .. start+length``
    (a cache that returns exactly the filled positions): query t sees keys ``0 .. start + t``."""
    if start == 0:
        return None, True
    if length == 1:
        return None, False  # one new token sees the whole prefix
    return torch.ones(length, start + length, dtype=torch.bool, device=device).tril(diagonal=start), False


@dataclass
class KVCache:
    """Preallocated keys and values of every layer, each [B, K, max_len, hd].

    Passed explicitly to ``Llama.forward`` (the model keeps no decoding state of its own). Positions
    are a Python int (attention reads the filled prefix ``0:start+T``) or, for compiled decoding, a
    0-d integer tensor: then every call has the same shapes (attention reads the whole buffer through
    a mask), so one compiled graph serves every position.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    def update(
        self, layer: int, start: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` [B, K, T, hd] at positions ``start:start+T``; return all of ``0:start+T``
        (an int ``start``) or the whole buffers [B, K, max_len, hd] (a tensor ``start``)."""
        if isinstance(start, torch.Tensor):
            positions = start + torch.arange(k.shape[2], device=k.device)  # [T]
            self.keys[layer].index_copy_(2, positions, k)
            self.values[layer].index_copy_(2, positions, v)
            return self.keys[layer], self.values[layer]
        end = start + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def attention_mask(
        self, start: int | torch.Tensor, length: int, device: torch.device
    ) -> tuple[torch.Tensor | None, bool]:
        """``(mask, is_causal)`` for ``length`` queries at ``start`` over the keys ``update`` returned:
        query t sees keys ``0 .. start + t``."""
        if isinstance(start, torch.Tensor):
            queries = start + torch.arange(length, device=device)  # [T]
            return torch.arange(self.max_len, device=device)[None, :] <= queries[:, None], False  # [T, max_len]
        return prefix_attention_mask(start, length, device)


# ----------------------------------------------------------------------------- scheme scales
def add_scale(module: nn.Module, scale: Scale | None) -> Scale | None:
    """Register the scheme's ``scale`` on ``module`` as a ``[width]`` parameter named ``scale.name``."""
    if scale is not None:
        module.register_parameter(scale.name, nn.Parameter(torch.full((scale.width,), float(scale.init))))
    return scale


def reset_scales(module: nn.Module, scales: Sequence[Scale | None]) -> None:
    for scale in scales:
        if scale is not None:
            nn.init.constant_(getattr(module, scale.name), scale.init)


def scale_values(module: nn.Module, scale: Scale) -> torch.Tensor:
    """The effective scale [width]: the parameter ``scale.name`` of ``module`` times ``scale.factor``."""
    return getattr(module, scale.name) * scale.factor


def apply_scale(module: nn.Module, y: torch.Tensor, scale: Scale | None) -> torch.Tensor:
    """``y * stored * factor`` over the last dimension of ``y``; ``y`` itself when the scheme has no scale."""
    if scale is None:
        return y
    return y * scale_values(module, scale).to(y.dtype)


# ----------------------------------------------------------------------------- attention and MLP
class Attention(nn.Module):
    """Causal grouped-query self-attention through ``scaled_dot_product_attention``.

    The norm scheme decides what happens inside (``NormScheme.attention_norms``): the query, key and
    value norms ``q_norm``/``k_norm``/``v_norm`` (identities without parameters where there are none),
    whether they act per head after the split or on the whole projection before it, and the softmax
    scale. By default ``config.qk_norm`` picks them: per-head RMSNorms of q and k (``"head"``, Qwen3,
    Gemma 3) or full-width ones (``"full"``, OLMo 2), before RoPE.
    """

    def __init__(self, config: LlamaConfig, layer_idx: int, scheme: NormScheme | None = None) -> None:
        super().__init__()
        scheme = scheme if scheme is not None else config.norm_scheme()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.dim, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.dim, bias=False)
        norms = scheme.attention_norms(
            config.dim, self.n_head, self.n_kv_head, self.head_dim, config.qk_norm_layout, config.qk_norm_eps
        )
        self.q_norm, self.k_norm, self.v_norm = norms.q, norms.k, norms.v
        self.q_scale, self.k_scale = add_scale(self, norms.q_scale), add_scale(self, norms.k_scale)
        self.norm_per_head = norms.layout == "head"
        """Whether the q/k/v norms act on each head [..., hd] (else on the whole projection)."""
        self.softmax_scale = norms.scale(self.head_dim)
        """The score scale the softmax sees; every consumer (the attention entropy) reads it here."""
        self._sdpa_scale = norms.softmax_scale  # None: the kernel's own 1/sqrt(hd), bit for bit SDPA's default

    def reset_parameters(self) -> None:
        """The scheme's q/k scales (the projections and norms reset themselves)."""
        reset_scales(self, (self.q_scale, self.k_scale))

    def _project(
        self, x: torch.Tensor, proj: nn.Linear, norm: nn.Module, heads: int, scale: Scale | None = None
    ) -> torch.Tensor:
        """``norm``-ed (and scaled) projection of ``x`` [B, T, d] split into heads [B, heads, T, hd]."""
        B, T, _ = x.shape
        y = proj(x)
        if not self.norm_per_head:
            y = apply_scale(self, norm(y), scale)  # over the whole projection, before the head split
        y = y.view(B, T, heads, self.head_dim).transpose(1, 2)
        return norm(y) if self.norm_per_head else y

    def qk(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries [B, H, T, hd] and keys [B, K, T, hd] of ``x`` [B, T, d], exactly as ``forward``
        computes them (StabilityMonitor recomputes them from here for the attention entropy)."""
        q = self._project(x, self.q_proj, self.q_norm, self.n_head, self.q_scale)  # [B, H, T, hd]
        k = self._project(x, self.k_proj, self.k_norm, self.n_kv_head, self.k_scale)  # [B, K, T, hd]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k = self.qk(x, cos, sin)  # [B, H, T, hd], [B, K, T, hd]
        v = self._project(x, self.v_proj, self.v_norm, self.n_kv_head)  # [B, K, T, hd]
        mask, causal = None, True
        if cache is not None:
            k, v = cache.update(self.layer_idx, start_pos, k, v)  # [B, K, S, hd]
            mask, causal = cache.attention_mask(start_pos, T, x.device)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=self._sdpa_scale, enable_gqa=self.n_head != self.n_kv_head
        )  # [B, H, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, with the scheme's scales of the two inputs where it has them
    (``NormScheme.mlp_scales``; nGPT: ``down((up(x) * s_up) * silu(gate(x) * s_gate * sqrt(d)))``)."""

    def __init__(self, config: LlamaConfig, scheme: NormScheme | None = None) -> None:
        super().__init__()
        scheme = scheme if scheme is not None else config.norm_scheme()
        self.gate_proj = nn.Linear(config.dim, config.mlp_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.mlp_dim, bias=False)
        self.down_proj = nn.Linear(config.mlp_dim, config.dim, bias=False)
        scales = scheme.mlp_scales(config.dim, config.mlp_dim)
        self.up_scale, self.gate_scale = add_scale(self, scales.up), add_scale(self, scales.gate)

    def reset_parameters(self) -> None:
        """The scheme's input scales (the projections reset themselves)."""
        reset_scales(self, (self.up_scale, self.gate_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = apply_scale(self, self.gate_proj(x), self.gate_scale)
        return self.down_proj(F.silu(gate) * apply_scale(self, self.up_proj(x), self.up_scale))


# ----------------------------------------------------------------------------- block
class Block(nn.Module):
    """One decoder block with a single code path for every norm scheme: the scheme's
    ``BlockNorms`` decide what happens at each site; the block never looks at the scheme's name."""

    def __init__(self, config: LlamaConfig, layer_idx: int, scheme: NormScheme) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn = Attention(config, layer_idx, scheme)
        self.mlp = MLP(config, scheme)
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
        a = self.norms.post_attn(self.attn(u, cos, sin, cache, start_pos))
        h = self.norms.attn_residual(self.norms.attn_update(x, a))
        v = self.norms.pre_mlp(h, ctx)  # site B, may reuse site A's statistic
        return self.norms.mlp_residual(self.norms.mlp_update(h, self.norms.post_mlp(self.mlp(v))))

    def refresh_norm_constants(self) -> None:
        self.norms.refresh_constants(self.attn)


# ----------------------------------------------------------------------------- model
class Llama(nn.Module):
    """The decoder. Build it from a config (``Llama(LlamaConfig.from_name("tiny", norm="bhyt"))``).

    Weight-derived norm constants (BHyT's ``c``) are outside the state dict: they are recomputed after
    ``reset_parameters`` and after every ``load_state_dict`` (a post-load hook). A training checkpoint also
    carries the values in use when it was saved (``norm_constants``; ``NormConstantRefresh`` stores them), which
    differ from the recomputed ones between two scheduled refreshes: resuming a fit and ``load_model`` put them
    back with ``set_norm_constants``, so the model computes exactly what it computed at that step.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        scheme = config.norm_scheme()
        self.scheme = scheme
        """The norm scheme, asked for its weight constraint (``constrain_weights``)."""
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.emb_norm = scheme.embedding_norm(config.dim)
        self.layers = nn.ModuleList(Block(config, i, scheme) for i in range(config.n_layers))
        self.final_norm = scheme.final_norm(config.dim, config.n_layers)
        # tied: the output projection reads ``embed.weight`` directly instead of sharing a Parameter
        # between two modules, which meta-device materialisation (``to_empty``) would silently untie
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.dim, config.vocab_size, bias=False)
        self.logit_scale = add_scale(self, scheme.logit_scale(config.dim, config.vocab_size))  # nGPT's s_z
        self.activation_checkpointing = False
        """Recompute each block in backward while training (set by the trainer; not architecture)."""
        self.loss_impl = "auto"
        """How ``forward(idx, labels=...)`` computes the loss (``bhyt_pl.loss.LOSS_IMPLS``; set by the trainer)."""
        self.loss_chunk_tokens: int | None = None
        """Tokens per chunk of the chunked loss; None sizes chunks from the vocabulary."""
        self.register_load_state_dict_post_hook(_refresh_after_load)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)initialise every weight with the init policy, apply the scheme's weight constraint, then refresh
        the norm constants."""
        init_weights(self, self.config.init_std)
        reset_scales(self, (self.logit_scale,))
        self.constrain_weights()
        self.refresh_norm_constants()

    def width_matrices(self) -> list[tuple[torch.Tensor, int]]:
        """Every weight matrix with the dimension that runs along the model width ``d``: rows (``-1``) of the
        embedding, the output head and the q, k, v, gate and up projections, which read ``d``-vectors;
        columns (``0``) of the attention output and down projections, which write them."""
        out: list[tuple[torch.Tensor, int]] = [(self.embed.weight, -1)]
        if self.lm_head is not None:
            out.append((self.lm_head.weight, -1))
        for layer in self.layers:
            a, m = layer.attn, layer.mlp
            out += [(lin.weight, -1) for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj)]
            out += [(a.o_proj.weight, 0), (m.down_proj.weight, 0)]
        return out

    @torch.no_grad()
    def constrain_weights(self, *, keep_satisfied: bool = False) -> None:
        """The scheme's weight constraint (nGPT: unit norm along ``d``): after init, after loading weights and,
        from the trainer, after every optimizer step. A no-op for schemes without one. ``keep_satisfied``
        (used after loading weights) leaves weights that already satisfy the constraint up to rounding
        bit-for-bit as loaded (``NormScheme.constrain_weights``)."""
        self.scheme.constrain_weights(self.width_matrices(), keep_satisfied=keep_satisfied)

    def refresh_norm_constants(self) -> None:
        """Recompute cached, weight-derived norm constants (BHyT's ``c``) from the current weights."""
        for layer in self.layers:
            layer.refresh_norm_constants()

    def norm_constants(self) -> dict[str, torch.Tensor]:
        """The cached norm constants in use, as CPU copies named like buffers (``layers.3.norms.c``); empty for a
        scheme without any. The same on every rank (they are plain buffers, and every rank refreshes together)."""
        return {
            f"layers.{i}.norms.{name}": value.detach().to("cpu", copy=True)
            for i, layer in enumerate(self.layers)
            for name, value in layer.norms.constants().items()
        }

    def set_norm_constants(self, constants: Mapping[str, torch.Tensor]) -> None:
        """Put back the values ``norm_constants`` returned (a checkpoint's) instead of recomputing them from the
        weights; the names must be exactly this model's."""
        expected = self.norm_constants().keys()
        if constants.keys() != expected:
            missing, unexpected = sorted(expected - constants.keys()), sorted(constants.keys() - expected)
            raise ValueError(f"norm constants do not match the model: missing {missing}, unexpected {unexpected}")
        for i, layer in enumerate(self.layers):
            prefix = f"layers.{i}.norms."
            layer.norms.set_constants({k.removeprefix(prefix): v for k, v in constants.items() if k.startswith(prefix)})

    def rope(self, start_pos: int | torch.Tensor, length: int, device: torch.device, dtype: torch.dtype):
        positions = start_pos + torch.arange(length, device=device)  # a tensor start_pos keeps shapes static
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype, self.config.rope_scaling)

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int | torch.Tensor = 0,
        *,
        labels: torch.Tensor | None = None,
        loss_reduction: str = "mean",
    ) -> torch.Tensor | LossOutput:
        """Logits [B, T, V], in the parameters' dtype, for token ids ``idx`` [B, T].

        With ``cache``, ``idx`` holds the tokens at positions ``start_pos:start_pos+T`` and attends
        to the cached prefix as well.

        With ``labels`` [B, T] (the target of each position, -100 where unsupervised), returns
        ``LossOutput(loss, tokens)`` instead: the next-token cross-entropy (``loss_reduction``:
        ``mean``, ``sum`` or per-token ``none``) computed from the final hidden states a chunk at a
        time (``bhyt_pl.loss``), never holding the whole batch's float32 logits. The loss runs here,
        inside the root module's forward, because the tied output projection is the embedding, a
        root parameter that FSDP2 unshards only during this call.
        """
        B, T = idx.shape
        if isinstance(start_pos, int) and start_pos + T > self.config.max_seq_len:
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
        x = self.final_norm(x)
        if labels is not None:
            return linear_cross_entropy(
                x,
                self.scaled_output_weight(),
                labels,
                impl=self.loss_impl,
                chunk_tokens=self.loss_chunk_tokens,
                reduction=loss_reduction,
            )
        return self.output(x)

    def output_weight(self) -> torch.Tensor:
        """The output projection's weight [V, d]: ``lm_head``'s, or the embedding matrix when tied."""
        return self.lm_head.weight if self.lm_head is not None else self.embed.weight

    def scaled_output_weight(self) -> torch.Tensor:
        """The output weight with the scheme's logit scale folded into its rows (``diag(s) W``), so the chunked
        loss computes the same logits as ``output``; the plain weight when the scheme has no scale."""
        weight = self.output_weight()
        if self.logit_scale is None:
            return weight
        return weight * scale_values(self, self.logit_scale).to(weight.dtype)[:, None]  # [V, d] * [V, 1]

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """Output projection [..., d] -> [..., V] (the embedding matrix when tied), times the logit scale."""
        return apply_scale(self, F.linear(x, self.output_weight()), self.logit_scale)

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
        eos_id: int | Sequence[int] | None = None,
        generator: torch.Generator | None = None,
        stop: Callable[[torch.Tensor], bool] | None = None,
        compile: bool = False,
    ) -> torch.Tensor:
        """Extend ``prompt`` [B, T0] by up to ``max_new_tokens`` tokens with a KV cache.

        Args:
            prompt: token ids, the same length for every row.
            max_new_tokens: most tokens to add.
            temperature: 0 for greedy decoding, else the softmax temperature of sampling.
            top_k: sample only among the ``top_k`` most likely tokens.
            eos_id: a row stops at this token, or at any of several (it is kept; later positions repeat
                it); generation ends when every row has stopped.
            generator: random generator for reproducible sampling.
            stop: called with the tokens so far [B, T0 + k] after each new token; generation ends when it
                returns True (e.g. a stop string in the decoded text, as lm-eval's ``until``).
            compile: decode with one ``torch.compile``-d step of fixed shapes: a static cache of
                ``static_cache_len(T0 + max_new_tokens)`` positions and the position as a tensor, so
                the graph compiled at the first step serves every later position and every later call
                with the same batch size and cache length. The prompt's prefill runs eager.

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
        cache = self.new_kv_cache(B, self.static_cache_len(total) if compile else total)
        step = _compiled_decode_step() if compile else _decode_step
        tokens = prompt
        done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
        eos_ids = None if eos_id is None else torch.tensor(eos_id, device=prompt.device).reshape(-1)
        logits = self(prompt, cache, 0)[:, -1]  # prefill, [B, V]
        for pos in range(T0, total):
            nxt = _sample(logits.float(), temperature, top_k, generator)  # [B]
            if eos_ids is not None:
                nxt = torch.where(done, tokens[:, -1], nxt)  # a stopped row repeats its stop token
                done = done | torch.isin(nxt, eos_ids)
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if (eos_ids is not None and bool(done.all())) or pos + 1 == total or (stop is not None and stop(tokens)):
                break
            # decode one token; compiled, the position is a tensor so its value never specialises the graph
            logits = step(self, nxt[:, None], torch.tensor(pos, device=prompt.device) if compile else pos, cache)
        return tokens

    def static_cache_len(self, total: int) -> int:
        """Cache length of compiled decoding for ``total`` tokens: the next power of two (at least 64),
        at most ``max_seq_len``. Buckets bound the number of compiled graphs to a handful while a short
        generation does not attend over ``max_seq_len`` masked positions."""
        return min(self.config.max_seq_len, max(64, 1 << (total - 1).bit_length()))


def _decode_step(model: Llama, token: torch.Tensor, pos: int | torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits [B, V] of the next token after ``token`` [B, 1] at position ``pos``."""
    return model(token, cache, pos)[:, -1]


@functools.cache
def _compiled_decode_step():
    # made on first use (torch.compile imports dynamo); dynamic=False: a static cache has fixed shapes
    return torch.compile(_decode_step, dynamic=False, fullgraph=True)


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
    # a state dict never carries ``c`` (non-persistent); recompute it from the loaded weights (the value a
    # refresh at the checkpoint's step gives; a training checkpoint's own values, when present, are put back
    # after this by whoever reads them: ``NormConstantRefresh`` on resume, ``load_model``), and put the
    # loaded weights back on the scheme's constraint set (nGPT's unit norms), leaving weights that already
    # satisfy it exactly as loaded so that resuming is bit-identical
    module.constrain_weights(keep_satisfied=True)
    module.refresh_norm_constants()

"""The norm sites of one block alone, forward and backward, at a model's width.

One "block" of norm work is what ``Block.forward`` asks of its ``BlockNorms``: ``pre_attn`` on the
block input, ``post_attn`` on the attention output, ``attn_residual`` after the first residual add,
``pre_mlp`` on ``h`` (with site A's context), ``post_mlp`` on the MLP output and ``mlp_residual``
after the second add; the adds are the scheme's residual updates (``attn_update``, ``mlp_update``). The
attention and the MLP are replaced by fixed tensors, so the time is the norms' (two sites, four for
Peri-LN) plus the two residual adds every scheme shares. Norms inside attention (QK-norm, HybridNorm's
q/k/v norms) are not block sites and are not timed here; ``bench`` times them in the train step.

Roofline: ``site_bytes`` is the compulsory memory traffic of that work (each norm site reads its
input and writes its output forward, and reads the output gradient and its input and writes the
input gradient backward; each residual add reads two tensors and writes one in each direction), and
``memory_bandwidth`` the machine's (a copy measured in the same run; on CUDA also the datasheet's),
so ``bytes / time / bandwidth`` says how close a site is to the memory-bound floor.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model import Attention
from bhyt_pl.norms import BlockNorms, NormScheme
from bhyt_pl.run_config import build_run_config
from bhyt_pl.run_facts import build_run_facts
from bhyt_pl.variants import Variant

__all__ = ["DATASHEET_BANDWIDTH", "block_norms", "memory_bandwidth", "site_bytes", "site_step"]

DATASHEET_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.039e12, "A100": 1.555e12}
"""Peak HBM bandwidth in bytes/s by GPU name (substring match, first hit)."""


def site_bytes(norms: BlockNorms, tokens: int, dim: int, dtype: torch.dtype) -> int:
    """Compulsory bytes of one forward+backward of a block's sites (see the module docstring)."""
    modules = (norms.attn_in, norms.attn_out, norms.attn_res, norms.mlp_in, norms.mlp_out, norms.mlp_res)
    sites = sum(not isinstance(m, nn.Identity) for m in modules)
    element = torch.empty((), dtype=dtype).element_size()
    return (5 * sites + 2 * 6) * tokens * dim * element  # plus two residual adds


def memory_bandwidth(device: torch.device, nbytes: int = 256 * 2**20, repeats: int = 7) -> dict[str, float | None]:
    """``{"copy": measured bytes/s, "datasheet": bytes/s or None}``; a copy moves ``2 * nbytes`` (read + write)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    out: dict[str, float | None] = {"copy": 2 * nbytes / statistics.median(times[1:]), "datasheet": None}
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        out["datasheet"] = next((bw for key, bw in DATASHEET_BANDWIDTH.items() if key in name), None)
    return out


def block_norms(
    variant: Variant,
    dim: int,
    n_layers: int,
    device: torch.device,
    dtype: torch.dtype,
    seq_len: int,
    batch_size: int | None = None,
) -> BlockNorms:
    """The norms of block 0 of ``n_layers`` for ``variant``, bound to the run facts of the benchmark's
    settings (``build_run_facts``: the training length ``seq_len``, the training ``batch_size``), with
    their weight-derived constants refreshed from a stand-in attention (BHyT's ``c`` comes out at a typical
    0.5; any positive value exercises the correction)."""
    # the scheme of a model of this width and depth, built as every run builds it; the attention's shape
    # (one head of width 2) reaches the norms only through refresh_constants
    shape = {"dim": dim, "n_layers": n_layers, "n_heads": 1, "n_kv_heads": 1, "head_dim": 2, "max_seq_len": seq_len}
    facts = build_run_facts(seq_len=seq_len, batch_size=batch_size)
    config = build_run_config("tiny", variant.norm, variant.norm_args, shape, facts)
    scheme = config.norm_scheme()
    norms = scheme.block_norms(dim, 0, n_layers)
    norms = norms.to(device=device, dtype=dtype)
    norms.refresh_constants(_stand_in_attention(config, scheme, seq_len).to(device))
    return norms


def _stand_in_attention(config: LlamaConfig, scheme: NormScheme, seq_len: int) -> Attention:
    """Block 0's attention with constant value and output weights ``a``: ``W_O W_V`` is ``2 a^2`` everywhere
    ([d, d]), so ``c = ||W_O W_V||_F^2 / (T d) = 4 a^4 d / T``, 0.5 for ``a = (T / (8 d))^(1/4)``."""
    attn = Attention(config, 0, scheme)
    a = (seq_len / (8 * config.dim)) ** 0.25
    with torch.no_grad():
        attn.v_proj.weight.fill_(a)
        attn.o_proj.weight.fill_(a)
    return attn


def _forward(norms: BlockNorms, x: torch.Tensor, a: torch.Tensor, m: torch.Tensor):
    u, ctx = norms.pre_attn(x)  # site A: x [N, d]
    h = norms.attn_residual(norms.attn_update(x, norms.post_attn(a)))  # a stands in for Attn(u)
    v = norms.pre_mlp(h, ctx)  # site B
    y = norms.mlp_residual(norms.mlp_update(h, norms.post_mlp(m)))  # m stands in for MLP(v)
    return u, v, y


def site_step(
    norms: BlockNorms, tokens: int, compile: bool, device: torch.device, dtype: torch.dtype, dim: int
) -> tuple[Callable[[], None], Callable[[], object]]:
    """``(step, forward)``: one forward+backward of the block's sites on [tokens, dim] inputs, and the
    forward alone (for the saved-activation count). Inputs are made once, outside the timing."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    make = lambda: torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype).requires_grad_()  # noqa: E731
    x, a, m = make(), make(), make()
    grads = [torch.randn(tokens, dim, generator=gen).to(device=device, dtype=dtype) for _ in range(3)]
    fwd = torch.compile(_forward, dynamic=False) if compile else _forward

    def forward():
        return fwd(norms, x, a, m)

    def step() -> None:
        outs = forward()
        torch.autograd.backward(outs, grads)
        for t in (x, a, m, *norms.parameters()):
            t.grad = None

    return step, forward

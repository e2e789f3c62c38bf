"""``gpas``: Pre-LN RMSNorm and, after each residual add, ``z - SiLU(g) * stopgrad(z)`` (arXiv 2506.22049):
its float64 reference for the shared per-scheme checks, and the gate's gradient."""

from __future__ import annotations

import torch
from reference_model import Case, SchemeReference, _p, mlp_ref, rms

from bhyt_pl.norms import GPASBlockNorms, RMSNorm


def _block(x, layer, li, model, args, attend):
    """Pre-LN; after each add z - SiLU(g) z (the stopgrad changes only the backward)."""
    n, eps = layer.norms, args.get("eps", 1e-6)
    g = _p(n.gpas_gate)
    shrink = g * torch.sigmoid(g)
    h = x + attend(rms(x, n.attn_in.weight, eps), layer.attn)
    h = h - shrink * h
    x = h + mlp_ref(rms(h, n.mlp_in.weight, eps), layer.mlp)
    return x - shrink * x


REFERENCES = {
    "gpas": SchemeReference(
        block=_block,
        final=lambda x, f, args: rms(x, f.weight, args.get("eps", 1e-6)),
        cases=(Case({"eps": 1e-3}), Case(overrides={"qk_norm": "full"})),
    ),
}


def test_gpas_gate_scales_forward_but_not_the_stream_gradient() -> None:
    """GPAS: after an add the forward value is ``(1 - SiLU(g)) z`` while dL/dz passes unchanged (stopgrad)."""
    norms = GPASBlockNorms(RMSNorm(4), RMSNorm(4)).double()
    with torch.no_grad():
        norms.gpas_gate.fill_(0.7)
    z = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = norms.attn_residual(z)
    silu = 0.7 / (1 + torch.exp(torch.tensor(-0.7, dtype=torch.float64)))
    torch.testing.assert_close(out, (1 - silu) * z, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    torch.testing.assert_close(z.grad, torch.ones_like(z))  # not (1 - silu): the scaled copy is detached
    # the gate learns: d out / d g = -SiLU'(g) z
    sig = torch.sigmoid(torch.tensor(0.7, dtype=torch.float64))
    torch.testing.assert_close(norms.gpas_gate.grad, -(sig * (1 + 0.7 * (1 - sig))) * z.detach().sum().reshape(1))

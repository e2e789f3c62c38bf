"""``bhyt_pl.bench.prenorm``: the timed unit is both pre-norm sites of a block, forward and backward."""

from __future__ import annotations

import torch

from bhyt_pl.bench.prenorm import prenorm_step
from bhyt_pl.norms import build_norm_scheme

CPU = torch.device("cpu")


def test_the_step_is_pre_attn_then_pre_mlp_forward_and_backward_and_clears_its_gradients() -> None:
    tokens, dim = 6, 16
    norms = build_norm_scheme("rmsnorm").block_norms(dim, 0, 2)
    with torch.no_grad():
        norms.attn_in.weight.uniform_(0.5, 1.5)
        norms.mlp_in.weight.uniform_(0.5, 1.5)
    grads: dict[str, torch.Tensor] = {}
    for name, p in norms.named_parameters():
        p.register_hook(lambda g, name=name: grads.__setitem__(name, g.clone()))
    step = prenorm_step(norms, tokens, dim, CPU, torch.float32)
    step()
    gen = torch.Generator(device="cpu").manual_seed(0)  # the step's own inputs, in its order
    x, h, g_u, g_v = (torch.randn(tokens, dim, generator=gen) for _ in range(4))
    unit = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)  # noqa: E731, RMSNorm without its gain
    # d/dw of sum(g * w * unit(z)) is sum over tokens of g * unit(z): site A on x, site B on h
    torch.testing.assert_close(grads["attn_in.weight"], (g_u * unit(x)).sum(0))
    torch.testing.assert_close(grads["mlp_in.weight"], (g_v * unit(h)).sum(0))
    assert all(p.grad is None for p in norms.parameters())


def test_bhyt_site_b_runs_on_h_with_site_a_statistic() -> None:
    """BHyT's site B gets site A's statistic: its gradient reaches site A's lambda only through that
    statistic's stop-gradient (none), so lambda_A's gradient is site A's alone."""
    tokens, dim = 5, 8
    norms = build_norm_scheme("bhyt", seq_len=16).block_norms(dim, 0, 2).double()
    with torch.no_grad():
        norms.c.fill_(0.3)
    seen: dict[str, torch.Tensor] = {}
    norms.attn_in.lambda_.register_hook(lambda g: seen.__setitem__("lambda_attn", g.clone()))
    prenorm_step(norms, tokens, dim, CPU, torch.float64)()
    gen = torch.Generator(device="cpu").manual_seed(0)
    x, h, g_u, g_v = (torch.randn(tokens, dim, generator=gen).double() for _ in range(4))
    lam = norms.attn_in.lambda_.detach().clone().requires_grad_(True)
    u = torch.tanh(lam * x / (10.0 * torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)))  # gain 1, kappa 10
    (expected,) = torch.autograd.grad((u * g_u).sum(), [lam])
    torch.testing.assert_close(seen["lambda_attn"], expected)

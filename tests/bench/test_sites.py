"""``bhyt_pl.bench.sites``: the roofline byte count, the benchmarked block of norms and its step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.bench.sites import block_norms, memory_bandwidth, site_bytes, site_step
from bhyt_pl.norms import registered_norms

CPU = torch.device("cpu")


def _variant(norm: str, **norm_args) -> SimpleNamespace:
    return SimpleNamespace(norm=norm, norm_args=norm_args, label=norm)


@pytest.mark.parametrize(("norm", "sites"), [("rmsnorm", 2), ("bhyt", 2), ("peri_ln", 4)])
def test_site_bytes_are_five_tensors_per_site_and_six_per_residual_add(norm: str, sites: int) -> None:
    norms = block_norms(_variant(norm), 16, 4, CPU, torch.float32, seq_len=32)
    tokens, dim = 10, 16
    # a site: forward reads x, writes y; backward reads dy and x, writes dx. An add: 3 forward + 3 backward
    assert site_bytes(norms, tokens, dim, torch.float32) == (5 * sites + 2 * 6) * tokens * dim * 4
    assert site_bytes(norms, tokens, dim, torch.bfloat16) == (5 * sites + 2 * 6) * tokens * dim * 2


def test_block_norms_are_bound_to_the_run_and_bhyt_gets_a_positive_constant() -> None:
    norms = block_norms(_variant("bhyt"), 16, 4, CPU, torch.bfloat16, seq_len=64)
    assert norms.seq_len == 64 and float(norms.c) == pytest.approx(0.5, rel=1e-2)  # c from refresh_constants
    assert norms.attn_in.weight.dtype == torch.bfloat16
    assert not hasattr(block_norms(_variant("rmsnorm"), 16, 4, CPU, torch.float32, seq_len=64), "c")


def test_site_step_composes_the_block_and_clears_gradients() -> None:
    dim, tokens = 16, 6
    norms = block_norms(_variant("rmsnorm"), dim, 4, CPU, torch.float32, seq_len=32)
    step, forward = site_step(norms, tokens, compile=False, device=CPU, dtype=torch.float32, dim=dim)
    gen = torch.Generator(device="cpu").manual_seed(0)  # the step's own fixed inputs
    x, a, m = (torch.randn(tokens, dim, generator=gen) for _ in range(3))
    u, v, y = forward()
    rms = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)  # noqa: E731, RMSNorm, unit gain
    torch.testing.assert_close(u, rms(x))
    torch.testing.assert_close(v, rms(x + a))  # pre-LN: site B normalises h = x + a
    torch.testing.assert_close(y, x + a + m)  # no post or residual sites
    step()
    assert all(p.grad is None for p in norms.parameters())


def test_memory_bandwidth_on_cpu_has_a_copy_rate_and_no_datasheet() -> None:
    out = memory_bandwidth(CPU, nbytes=4 * 2**20, repeats=3)
    assert out["datasheet"] is None and out["copy"] > 0


@pytest.mark.parametrize("norm", registered_norms())
def test_site_step_runs_every_registered_scheme(norm: str) -> None:
    """Every scheme's block of sites runs forward and backward in the benchmark, and the step clears what it
    accumulated (block 0 of 16)."""
    norms = block_norms(_variant(norm), 16, 16, CPU, torch.float32, seq_len=64)
    step, forward = site_step(norms, 8, False, CPU, torch.float32, 16)
    step()
    u, v, y = forward()
    assert u.shape == v.shape == y.shape == (8, 16)
    assert all(p.grad is None for p in norms.parameters())


@pytest.mark.parametrize("norm", ["post_ln", "mix_ln", "hybridnorm"])
def test_site_step_drives_the_residual_sites(norm: str) -> None:
    """The sites benchmark drives the post-residual sites too (block 0 of 16: Mix-LN's first layer is Post-LN):
    a block that ends in a norm has unit RMS per token; HybridNorm's MLP reads the normalised stream after the
    attention add, with no norm of its own."""
    norms = block_norms(_variant(norm), 16, 16, CPU, torch.float32, seq_len=64)
    _, forward = site_step(norms, 8, False, CPU, torch.float32, 16)
    _, v, y = forward()
    unit = torch.ones(8)
    if norm == "hybridnorm":
        torch.testing.assert_close(v.pow(2).mean(-1), unit, atol=1e-4, rtol=1e-4)
    else:
        torch.testing.assert_close(y.pow(2).mean(-1), unit, atol=1e-4, rtol=1e-4)

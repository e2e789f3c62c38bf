"""BHyT's autograd kernels (``bhyt_pl/norms/bhyt_kernels.py``): the rational tanh within 1e-6 of ``torch.tanh``,
and ``BHyTSiteFunction`` (BHyT's eager default) against the plain-ops reference and a formula in float64:
values and gradients of x, gamma and lambda, site B's statistic and its stop-gradient, meanstd, the
final norm and exact_layers, with row blocks that do not divide the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from bhyt_pl.bench.tanh import dense_grid, max_relative_error
from bhyt_pl.norms import BHyT, bhyt_kernels, build_norm_scheme
from bhyt_pl.norms.bhyt import SiteStats
from bhyt_pl.norms.bhyt_kernels import BHyTSiteFunction, rational_tanh

KAPPA, EPS = 10.0, 1e-6


def formula(x, lam, gamma, spread=None, mean=None, stat="rms"):
    """docs/method.md, section 2, written out: ``gamma * tanh(lambda * x / D)``."""
    if spread is None:
        mean = x.mean(-1, keepdim=True)
        spread = x.pow(2).mean(-1, keepdim=True) if stat == "rms" else (x - mean).pow(2).mean(-1, keepdim=True)
    bound = KAPPA * torch.sqrt(spread + EPS) + (0 if stat == "rms" else mean.abs())
    return gamma * torch.tanh(lam * x / bound)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows of 16 per block: 7 tokens make two full blocks and a remainder."""
    monkeypatch.setattr(bhyt_kernels, "SITE_BLOCK_ELEMENTS", 48)


def test_rational_tanh_relative_error_over_the_real_line() -> None:
    grid = dense_grid()  # includes 0, +-1e-30 .. +-100, +-1e30 and +-inf
    assert max_relative_error(rational_tanh, grid) < 1e-6
    assert max_relative_error(rational_tanh, grid.bfloat16().float()) < 1e-6
    assert rational_tanh(torch.tensor([0.0, 30.0, -30.0])).tolist() == [0.0, 1.0, -1.0]


def test_rational_tanh_gradient_matches_torch_tanh() -> None:
    z = torch.cat([torch.linspace(-12, 12, 200_001), torch.logspace(-20, 1, 2001)])
    t = rational_tanh(z)
    # the fused backward uses 1 - t^2 from the recomputed t, as torch's tanh_backward does
    torch.testing.assert_close(1 - t * t, 1 - torch.tanh(z) ** 2, rtol=1e-5, atol=1e-6)


def test_rational_tanh_is_exact_in_float64() -> None:
    z = torch.randn(1000, dtype=torch.float64) * 5
    assert torch.equal(rational_tanh(z), torch.tanh(z))


def _leaf(*shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale + shift).requires_grad_(True)


@pytest.mark.parametrize("stat", ["rms", "meanstd"])
@pytest.mark.parametrize("save_tanh", [False, True])
def test_exact_site_gradcheck_with_its_statistics_used_downstream(stat: str, save_tanh: bool) -> None:
    x, lam, gamma = _leaf(7, 16, scale=3, shift=0.4), _leaf(1, shift=1.5), _leaf(16, shift=1.0)
    probe = torch.randn(7, 1, dtype=torch.float64)

    def f(x, lam, gamma):
        out = BHyTSiteFunction.apply(x, None, None, lam, gamma, EPS, KAPPA, stat, save_tanh)
        return out[0], (out[1] * probe).sum() + (0 if stat == "rms" else (out[2] * probe).sum())

    assert torch.autograd.gradcheck(f, (x, lam, gamma), eps=1e-6, atol=1e-7)
    y, _ = f(x, lam, gamma)
    torch.testing.assert_close(y, formula(x, lam, gamma, stat=stat), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stat", ["rms", "meanstd"])
def test_site_with_given_statistics_gradcheck(stat: str) -> None:
    x, lam, gamma = _leaf(7, 16, scale=2), _leaf(1, shift=0.8), _leaf(16, shift=1.0)
    spread = (torch.rand(7, 1, dtype=torch.float64) + 0.5).requires_grad_(True)
    mean = _leaf(7, 1, scale=0.3) if stat == "meanstd" else None
    inputs = (x, spread, lam, gamma) + ((mean,) if mean is not None else ())

    def f(x, spread, lam, gamma, mean=None):
        return BHyTSiteFunction.apply(x, mean, spread, lam, gamma, EPS, KAPPA, stat, False)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)
    torch.testing.assert_close(f(*inputs), formula(x, lam, gamma, spread, mean, stat), rtol=1e-12, atol=1e-12)


def _block_norms(impl: str, stat: str, **kwargs):
    scheme = build_norm_scheme("bhyt", impl=impl, stat=stat, lambda_final=0.7, **kwargs).bind(seq_len=8)
    norms = scheme.block_norms(16, 0, 4).double()
    with torch.no_grad():
        for site in (norms.attn_in, norms.mlp_in):
            site.weight.uniform_(0.5, 1.5)
        norms.attn_in.lambda_.fill_(1.7)
        norms.c.fill_(0.6)
    return norms, scheme


@pytest.mark.parametrize("stat", ["rms", "meanstd"])
@pytest.mark.parametrize("exact_layers", [None, 1], ids=["approximate", "exact-layer"])
def test_block_sites_equal_reference_float64(stat: str, exact_layers: int | None) -> None:
    """Both sites of a block (site B on ``h`` that depends on site A's output) and the final norm:
    outputs and every gradient equal the plain-ops path."""
    results = {}
    for impl in ("reference", "auto"):
        torch.manual_seed(3)  # the same gains and inputs for both paths
        norms, scheme = _block_norms(impl, stat, exact_layers=exact_layers)
        final = scheme.final_norm(16, 4).double()
        assert isinstance(final, BHyT) and norms.approximate == (exact_layers is None)
        x, noise = _leaf(2, 7, 16, scale=3, shift=0.2), torch.randn(2, 7, 16, dtype=torch.float64)
        u, ctx = norms.pre_attn(x)
        h = x + 0.5 * u.tanh() + noise  # h depends on site A's output, as x + Attn(u)
        v = norms.pre_mlp(h, ctx)
        z = final(v + h)
        loss = (u * noise).sum() + v.square().sum() + (z * noise.flip(0)).sum()
        params = [*norms.parameters(), *final.parameters()]
        results[impl] = [u, v, z, *torch.autograd.grad(loss, [x, *params])]
    assert type(results["auto"][0].grad_fn).__name__ == "BHyTSiteFunctionBackward"
    for a, b in zip(results["reference"], results["auto"]):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_site_b_sends_lambda_attn_no_gradient_through_its_statistic(impl: str) -> None:
    """With ``h`` independent of site A's output, site B reaches lambda_A only through the correction
    ``c * sg(lambda_A)^2 / kappa^2``: no gradient; the statistic itself still sends one to ``x``."""
    norms, _ = _block_norms(impl, "rms")
    x, h = _leaf(7, 16, scale=2), _leaf(7, 16, scale=2)
    _, ctx = norms.pre_attn(x)
    v = norms.pre_mlp(h, ctx)
    g_lam_a, g_x, g_lam_b = torch.autograd.grad(
        v.square().sum(), [norms.attn_in.lambda_, x, norms.mlp_in.lambda_], allow_unused=True
    )
    assert g_lam_a is None or torch.count_nonzero(g_lam_a) == 0
    assert g_x is not None and g_x.abs().max() > 0 and g_lam_b.abs().max() > 0
    # the same gradient to x from a formula: site B with m_A + c * lambda_A^2 / kappa^2 held as a constant lambda
    lam_a = norms.attn_in.lambda_.detach()
    x2 = x.detach().clone().requires_grad_(True)
    spread = x2.pow(2).mean(-1, keepdim=True) + norms.c * lam_a**2 / KAPPA**2
    expected = formula(h.detach(), norms.mlp_in.lambda_.detach(), norms.mlp_in.weight.detach(), spread)
    (g_formula,) = torch.autograd.grad(expected.square().sum(), [x2])
    torch.testing.assert_close(g_x, g_formula, rtol=1e-10, atol=1e-12)


def test_float32_and_bfloat16_within_the_rational_tanh_of_the_reference() -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        site = BHyT(16, 1.3, KAPPA, EPS).to(dtype)
        x64 = torch.randn(5, 7, 16, dtype=torch.float64) * 3
        x = x64.to(dtype).requires_grad_(True)
        y = site(x, SiteStats(None, x64.to(dtype).float().pow(2).mean(-1, keepdim=True) + 0.2))
        assert y.dtype == dtype
        y.float().sum().backward()
        expected = formula(x64.to(dtype).double(), 1.3, 1.0, x64.to(dtype).double().pow(2).mean(-1, keepdim=True) + 0.2)
        torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol)
        assert x.grad.dtype == dtype and site.lambda_.grad.dtype == dtype and torch.isfinite(x.grad).all()


def test_in_place_rational_tanh_relative_error_over_the_real_line() -> None:
    def in_place(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        return bhyt_kernels._tanh_(z, tuple(torch.empty_like(z) for _ in range(3)))

    grid = dense_grid()
    assert max_relative_error(in_place, grid) < 1e-6
    saturated = in_place(torch.tensor([0.0, 30.0, -30.0, math.inf]))
    torch.testing.assert_close(saturated, torch.tensor([0.0, 1.0, -1.0, 1.0]), rtol=0, atol=1e-6)

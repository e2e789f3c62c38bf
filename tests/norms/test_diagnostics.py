"""The diagnostics interface of the schemes (``BlockNorms.site_statistics``, ``NormScheme.diagnostics``)
against hand computations of the statistics from the method's formulas."""

from __future__ import annotations

import math

import pytest
import torch

from bhyt_pl.norms import BHyTScheme, build_norm_scheme

D, B, T = 8, 2, 12


def _mean(stat: tuple[torch.Tensor, float | torch.Tensor]) -> float:
    total, count = stat
    return float(total) / float(count)


def test_bhyt_site_b_reports_moment_ratios_saturation_and_lambda_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    norms = BHyTScheme(seq_len=16).block_norms(D, 0, 2)
    with torch.no_grad():
        norms.c.fill_(0.3)
        norms.mlp_in.lambda_.fill_(1.7)
    x, h = torch.randn(B, T, D, generator=g), 2.0 * torch.randn(B, T, D, generator=g)
    _, ctx = norms.pre_attn(x)
    got = norms.site_statistics("mlp_in", (h, norms.approximate_stats(ctx)), saturation_threshold=1.5)

    kappa, lambda_a = 10.0, 2.0  # p = 0.99; lambda_attn's default
    m_approx = x.pow(2).mean(-1) + 0.3 * lambda_a**2 / kappa**2  # [B, T], docs/method.md section 3
    m_exact = h.pow(2).mean(-1)
    ratio = m_approx / m_exact
    z = 1.7 * h / (kappa * torch.sqrt(m_approx + 1e-6))[..., None]  # the tanh argument the forward uses

    assert set(got) == {
        "saturation/mlp_in",
        "lambda/mlp_in",
        "bhyt_moment_ratio",
        "bhyt_moment_ratio_of_means",
        "bhyt_moment_ratio_first8",
        "bhyt_moment_ratio_rest",
    }
    assert _mean(got["bhyt_moment_ratio"]) == pytest.approx(float(ratio.mean()), rel=1e-5)
    assert _mean(got["bhyt_moment_ratio_of_means"]) == pytest.approx(float(m_approx.sum() / m_exact.sum()), rel=1e-5)
    assert _mean(got["bhyt_moment_ratio_first8"]) == pytest.approx(float(ratio[:, :8].mean()), rel=1e-5)
    assert _mean(got["bhyt_moment_ratio_rest"]) == pytest.approx(float(ratio[:, 8:].mean()), rel=1e-5)
    assert _mean(got["saturation/mlp_in"]) == pytest.approx(float((z.abs() > 1.5).float().mean()), abs=1e-6)
    assert 0 < _mean(got["saturation/mlp_in"]) < 1  # a discriminating threshold
    assert _mean(got["lambda/mlp_in"]) == pytest.approx(1.7)


def test_exact_sites_report_no_moment_ratio() -> None:
    x = torch.randn(B, T, D)
    site_a = BHyTScheme().block_norms(D, 0, 2).site_statistics("attn_in", (x,))
    assert set(site_a) == {"saturation/attn_in", "lambda/attn_in"}
    for norms in (
        build_norm_scheme("bhyt_exact").block_norms(D, 0, 2),
        BHyTScheme(exact_layers=1).block_norms(D, 0, 2),  # layer 0 is exact
    ):
        _, ctx = norms.pre_attn(x)
        assert set(norms.site_statistics("mlp_in", (x, ctx))) == {"saturation/mlp_in", "lambda/mlp_in"}


def test_dyt_site_reports_its_alpha_and_saturation_and_rmsnorm_nothing() -> None:
    norms = build_norm_scheme("dyt", alpha_attn=0.8).block_norms(D, 0, 2)
    x = torch.linspace(-4, 4, B * T * D).reshape(B, T, D)
    got = norms.site_statistics("attn_in", (x,), saturation_threshold=2.0)
    assert _mean(got["alpha/attn_in"]) == pytest.approx(0.8)
    assert _mean(got["saturation/attn_in"]) == pytest.approx(float((0.8 * x.abs() > 2.0).float().mean()))
    assert build_norm_scheme("rmsnorm").block_norms(D, 0, 2).site_statistics("attn_in", (x,)) == {}


def test_bhyt_variance_bound_diagnostic_at_init_and_learned() -> None:
    scheme = BHyTScheme(lambda_attn=3.0, lambda_mlp=1.0)  # kappa 10, L = 16: threshold 0.25
    assert build_norm_scheme("rmsnorm").diagnostics(16) == {}
    at_init = scheme.diagnostics(16)["variance_bound"]
    assert at_init == {
        "n_layers": 16,
        "kappa": pytest.approx(10.0),
        "lambda_attn": 3.0,
        "lambda_mlp": 1.0,
        "threshold": 0.25,
        "at_init": {"lambda_attn": False, "lambda_mlp": True, "all": False},
    }
    blocks = [scheme.block_norms(D, i, 3) for i in range(3)]
    with torch.no_grad():
        blocks[1].attn_in.lambda_.fill_(-2.4)  # |lambda| counts
        for b in blocks:
            b.mlp_in.lambda_.fill_(0.5)
    learned = scheme.diagnostics(3, blocks)["variance_bound"]
    assert learned["threshold"] == pytest.approx(1 / math.sqrt(3))
    assert learned["learned_max_lambda_attn"] == pytest.approx(3.0)
    assert learned["learned_max_lambda_mlp"] == pytest.approx(0.5)
    assert learned["learned_holds"] is (3.0 / 10 < 1 / math.sqrt(3))

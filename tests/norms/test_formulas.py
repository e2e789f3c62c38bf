"""Every scheme's model output equals a float64 re-computation from the formulas of docs/method.md."""

from __future__ import annotations

import pytest
import torch
from reference_model import model_ref, vo_constant_ref

from bhyt_pl import Llama, LlamaConfig

CASES = [
    ("rmsnorm", {}),
    ("layernorm", {}),
    ("lns", {}),
    ("peri_ln", {}),
    ("peri_ln", {"embed_norm": True}),
    ("dyt", {"alpha_attn": 0.8, "alpha_mlp": 0.2, "alpha_final": 0.3}),
    ("dyt", {"embedding_scale": False}),
    ("bhyt", {}),
    ("bhyt", {"lambda_attn": 1.0, "lambda_final": 1.5, "seq_len": 64}),
    ("bhyt", {"stat": "meanstd"}),
    ("bhyt", {"kappa": 4.0, "learnable_lambda": False}),
    ("bhyt", {"exact_layers": 2}),
    ("bhyt", {"exact_layers": [2, 0]}),
    ("bhyt", {"exact_layers": [1], "stat": "meanstd"}),
    ("bhyt_exact", {}),
    ("bhyt_exact", {"stat": "meanstd", "lambda_final": 1.0}),
    ("derf", {}),
    ("derf", {"alpha_attn": 0.8, "alpha_mlp": 0.2, "alpha_final": 0.3, "shift_init": 0.1, "bias": False}),
    ("dyisru", {}),
    ("dyisru", {"beta_init": 8.0, "embedding_scale": False}),
    ("seednorm", {}),
    ("seednorm", {"eps": 1e-3}),
    ("post_ln", {}),
    ("mix_ln", {}),  # 3 layers: floor(0.25 * 3) = 0 Post-LN layers, all Pre-LN
    ("mix_ln", {"alpha": 0.5}),  # 1 Post-LN layer, then 2 Pre-LN
    ("reordered", {}),
    ("reordered", {"eps": 1e-3}),
    ("hybridnorm", {}),
    ("hybridnorm", {"star": True, "eps": 1e-3}),
    ("ssnorm", {}),
    ("ssnorm", {"eps": 1e-3}),
    ("gpas", {}),
    ("gpas", {"eps": 1e-3}),
    ("ngpt", {}),
]


def _perturb_norm_params(model: Llama) -> None:
    """Move every gain, lambda, alpha, shift, beta and scale away from its init so a misplaced one shows
    (zero-initialised ones, such as biases, Derf's shift and SeeDNorm's beta, get a random offset)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.ndim < 2 and not name.endswith(".c"):
                if not t.any():
                    t.add_(0.2 * torch.randn(t.shape, generator=gen, dtype=t.dtype))
                t.mul_(1 + 0.3 * torch.rand(t.shape, generator=gen, dtype=t.dtype))


def _float64_model(config: LlamaConfig) -> Llama:
    """The model in float64 with weights larger than N(0, 0.02), so every block does something measurable."""
    model = Llama(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    model.refresh_norm_constants()
    return model


@pytest.mark.parametrize(("norm", "args"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_model_matches_float64_spec(norm: str, args: dict) -> None:
    config = LlamaConfig.from_name(
        "tiny", vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_dim=48, norm=norm, norm_args=args
    )
    model = _float64_model(config)
    _perturb_norm_params(model)
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        ours = model(idx)
    ref = model_ref(model, idx, norm, args)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("norm", ["rmsnorm", "post_ln", "derf"])
def test_qk_norm_matches_float64_formula(norm: str) -> None:
    """QK-norm: RMSNorm over the head dimension of q and k (own gains) before RoPE, with any scheme."""
    config = LlamaConfig.from_name(
        "tiny", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, norm=norm, qk_norm=True
    )
    model = _float64_model(config)
    _perturb_norm_params(model)
    attn = model.layers[0].attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (8,)  # head_dim
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        ours = model(idx)
    torch.testing.assert_close(ours, model_ref(model, idx, norm, {}), rtol=1e-9, atol=1e-9)
    with torch.no_grad():  # guard: the q/k gains reach the output, so the comparison above sees them
        attn.k_norm.weight.mul_(2.0)
        assert not torch.allclose(model(idx), ours)


@pytest.mark.parametrize("norm", ["rmsnorm", "reordered", "gpas"])
def test_full_qk_norm_matches_float64_formula(norm: str) -> None:
    """``qk_norm: full`` (OLMo 2): one RMSNorm over the whole projected q [H*hd] and k [K*hd], before the
    head split and RoPE."""
    config = LlamaConfig.from_name(
        "tiny", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, norm=norm, qk_norm="full"
    )
    model = _float64_model(config)
    _perturb_norm_params(model)
    attn = model.layers[0].attn
    assert attn.q_norm.weight.shape == (32,) and attn.k_norm.weight.shape == (16,)  # H*hd, K*hd
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        ours = model(idx)
    torch.testing.assert_close(ours, model_ref(model, idx, norm, {}), rtol=1e-9, atol=1e-9)
    with torch.no_grad():  # guard: the statistic spans the heads, so scaling key head 1 moves key head 0 too
        k = attn.k_proj.weight.clone()
        attn.k_proj.weight[8:].mul_(3.0)
        u = torch.randn(1, 5, 32, dtype=torch.float64)
        cos, sin = torch.ones(5, 8, dtype=torch.float64), torch.zeros(5, 8, dtype=torch.float64)
        head0_scaled = attn.qk(u, cos, sin)[1][:, 0]
        attn.k_proj.weight.copy_(k)
        assert not torch.allclose(head0_scaled, attn.qk(u, cos, sin)[1][:, 0])


def test_gpas_gate_scales_forward_but_not_the_stream_gradient() -> None:
    """GPAS: after an add the forward value is ``(1 - SiLU(g)) z`` while dL/dz passes unchanged (stopgrad)."""
    from bhyt_pl.norms import GPASBlockNorms, RMSNorm

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


def test_seednorm_equals_rmsnorm_at_init() -> None:
    kw = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48)
    torch.manual_seed(0)
    seed = Llama(LlamaConfig.from_name("tiny", norm="seednorm", **kw))
    torch.manual_seed(0)
    rms = Llama(LlamaConfig.from_name("tiny", norm="rmsnorm", **kw))
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(seed(idx), rms(idx))


def test_bhyt_correction_changes_the_output() -> None:
    """Guard: with a zeroed c the approximation differs, so the formula test above sees c."""
    config = LlamaConfig.from_name("tiny", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, norm="bhyt")
    model = _float64_model(config)
    c = float(model.layers[0].norms.c)
    assert c == pytest.approx(vo_constant_ref(model.layers[0].attn, 1024), rel=1e-6)
    idx = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        before = model(idx)
        for layer in model.layers:
            layer.norms.c.zero_()
        after = model(idx)
    assert not torch.allclose(before, after)


@pytest.mark.parametrize(("exact_layers", "expected"), [(None, [True] * 3), (2, [False, False, True]),
                                                        ([2, 0], [False, True, False]), (7, [False] * 3)])  # fmt: skip
def test_exact_layers_selects_site_b_statistics_per_layer(exact_layers, expected: list[bool]) -> None:
    """Which layers approximate; the approximated ones still get c, the exact ones don't need it."""
    config = LlamaConfig.from_name(
        "tiny", vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, norm="bhyt",
        norm_args={"exact_layers": exact_layers},
    )  # fmt: skip
    model = _float64_model(config)
    assert [layer.norms.approximate for layer in model.layers] == expected
    assert [float(layer.norms.c) > 0 for layer in model.layers] == expected
    names = {n for n, _ in model.named_parameters()}
    assert "layers.0.norms.mlp_in.lambda_" in names and "layers.0.norms.attn_in.lambda_" in names


def test_exact_layers_is_stored_hashable_and_validated() -> None:
    from bhyt_pl.norms import BHyTScheme

    a, b = BHyTScheme(exact_layers=[1, 0]), BHyTScheme(exact_layers=(0, 1))
    assert a.exact_layers == (0, 1) and a == b and hash(a) == hash(b)
    assert type(a)(**a.hparams()) == a
    assert BHyTScheme(exact_layers=2).exact_layers == 2
    assert BHyTScheme() != BHyTScheme(exact_layers=[0])
    with pytest.raises(ValueError, match="exact_layers indices must be >= 0"):
        BHyTScheme(exact_layers=[-1])
    with pytest.raises(TypeError, match="exact_layers must be None, an int k"):
        BHyTScheme(exact_layers="0,1")
    with pytest.raises(ValueError, match=r"exact_layers \[0, 5\] names layers beyond the model's 3"):
        Llama(LlamaConfig.from_name("tiny", vocab_size=64, dim=32, n_layers=3, norm="bhyt",
                                    norm_args={"exact_layers": [0, 5]}))  # fmt: skip

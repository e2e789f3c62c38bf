"""BHyT specifics: gradients (docs/method.md, section 3), the cached constant c, fixed lambdas, the theorem helper."""

from __future__ import annotations

import pytest
import torch
from reference_model import vo_constant_ref

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.model import Block
from bhyt_pl.norms import BHyTScheme, satisfies_variance_bound, vo_constant


def _block(norm: str, **args) -> tuple[Block, LlamaConfig]:
    config = LlamaConfig(
        dim=8, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=12, vocab_size=16, norm=norm, norm_args=args
    )
    block = Block(config, 0, config.norm_scheme()).double()
    with torch.no_grad():
        for p in block.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.4)
    block.refresh_norm_constants()
    return block, config


@pytest.mark.parametrize("norm", ["bhyt", "bhyt_exact"])
@pytest.mark.parametrize("stat", ["rms", "meanstd"])
def test_gradcheck_block(norm: str, stat: str) -> None:
    block, config = _block(norm, stat=stat, seq_len=16) if norm == "bhyt" else _block(norm, stat=stat)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    cos, sin = config_rope(config, x)
    names = ["norms.mlp_in.lambda_", "norms.attn_in.weight", "norms.mlp_in.weight", "attn.v_proj.weight"]
    if norm == "bhyt_exact":
        # bhyt's correction uses stopgrad(lambda_attn), so there finite differences of lambda_attn
        # legitimately differ from the analytic gradient; that path has its own test below
        names.append("norms.attn_in.lambda_")
    params = dict(block.named_parameters())

    def f(x, *values):
        return torch.func.functional_call(block, dict(zip(names, values)), (x, cos, sin))

    inputs = (x.requires_grad_(True), *[params[n].detach().clone().requires_grad_(True) for n in names])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def config_rope(config: LlamaConfig, x: torch.Tensor):
    from bhyt_pl.model import rope_cos_sin

    return rope_cos_sin(torch.arange(x.shape[1]), config.head_dim, config.rope_theta, x.dtype)


def test_correction_sends_no_gradient_to_lambda_attn_or_attention_weights_through_c() -> None:
    block, config = _block("bhyt", seq_len=4)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    cos, sin = config_rope(config, x)
    n = block.norms
    x.requires_grad_(True)
    u, stats = n.pre_attn(x)
    h = x + n.post_attn(block.attn(u, cos, sin))
    # site B's statistic alone: no gradient path to lambda_attn or W_V/W_O (only to x)
    spread = n.approximate_stats(stats).spread
    assert float(n.c) > 0 and spread.requires_grad
    grads = torch.autograd.grad(
        spread.sum(),
        [n.attn_in.lambda_, block.attn.v_proj.weight, block.attn.o_proj.weight],
        allow_unused=True,
        retain_graph=True,  # eager, site A's output and statistic are one autograd node (BHyTSiteFunction)
    )
    assert grads == (None, None, None)
    assert not n.c.requires_grad
    # ... while the whole site B output does depend on lambda_attn through h (attention input u)
    v = n.pre_mlp(h, stats)
    (g_lam,) = torch.autograd.grad(v.sum(), [n.attn_in.lambda_])
    assert g_lam.abs() > 0


def test_site_b_statistic_sends_gradient_to_block_input() -> None:
    block, config = _block("bhyt", seq_len=4)
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    _, stats = block.norms.pre_attn(x)
    spread = block.norms.approximate_stats(stats).spread
    (g,) = torch.autograd.grad(spread.sum(), [x])
    # d/dx sum_t mean_i x_ti^2 = 2 x / d, computed by hand
    torch.testing.assert_close(g, 2 * x.detach() / 8)


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(4, 4), (4, 2), (4, 1)])
def test_c_equals_dense_product_with_gqa_expansion(n_heads: int, n_kv_heads: int) -> None:
    config = LlamaConfig(
        dim=16,
        n_layers=1,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        mlp_dim=8,
        vocab_size=8,
        norm="bhyt",
        norm_args={"seq_len": 7},
    )
    model = Llama(config)
    attn = model.layers[0].attn
    with torch.no_grad():
        attn.v_proj.weight.normal_()
        attn.o_proj.weight.normal_()
    model.refresh_norm_constants()
    expected = vo_constant_ref(attn, 7)
    assert float(model.layers[0].norms.c) == pytest.approx(expected, rel=1e-5)
    assert float(
        vo_constant(attn.v_proj.weight.detach(), attn.o_proj.weight.detach(), n_heads, n_kv_heads, 7)
    ) == pytest.approx(expected, rel=1e-5)


def test_c_is_never_saved_and_is_recomputed_after_load() -> None:
    config = LlamaConfig.from_name("tiny", n_layers=2, norm="bhyt")
    a, b = Llama(config), Llama(config)
    assert not any(k.endswith(".c") for k in a.state_dict())
    with torch.no_grad():
        for layer in b.layers:
            layer.norms.c.fill_(123.0)  # stale value
    b.load_state_dict(a.state_dict())
    for la, lb in zip(a.layers, b.layers):
        assert float(lb.norms.c) == pytest.approx(vo_constant_ref(la.attn, 1024), rel=1e-5)


def test_fixed_lambda_does_not_train() -> None:
    model = Llama(LlamaConfig.from_name("tiny", n_layers=1, norm="bhyt", norm_args={"learnable_lambda": False}))
    lam = model.layers[0].norms.attn_in.lambda_
    assert not lam.requires_grad
    assert all(p is not lam for p in model.parameters())
    assert float(lam) == 2.0


def test_kappa_from_p_and_defaults() -> None:
    scheme = BHyTScheme()
    assert scheme.kappa_value == pytest.approx(10.0)
    assert (scheme.lambda_attn, scheme.lambda_mlp, scheme.lambda_final) == (2.0, 1.0, 0.0)
    assert BHyTScheme(p=0.75).kappa_value == pytest.approx(2.0)
    assert BHyTScheme(kappa=3.0, p=0.5).kappa_value == 3.0


def test_variance_bound_condition() -> None:
    # lambda/kappa < 1/sqrt(L): with kappa = 10, L = 16 needs lambda < 2.5
    assert satisfies_variance_bound(2.0, 10.0, 16)
    assert not satisfies_variance_bound(3.0, 10.0, 16)
    assert not satisfies_variance_bound(2.5, 10.0, 16)  # strict
    report = BHyTScheme(lambda_attn=3.0, lambda_mlp=1.0).variance_bound_report(16)
    assert report == {"lambda_attn": False, "lambda_mlp": True, "all": False}


def test_save_tanh_is_a_scheme_argument_with_the_same_function() -> None:
    """``bhyt:save_tanh=true`` (the bench's memory-for-time variant) reaches every site's Function, which then
    saves its tanh for backward (one more saved tensor) and gives the same outputs and gradients."""
    from bhyt_pl.norms import build_norm_scheme

    results, saved = {}, {}
    for save in (False, True):
        torch.manual_seed(0)
        norms = build_norm_scheme("bhyt", save_tanh=save).block_norms(16, 0, 2)
        assert norms.attn_in.save_tanh is save and norms.mlp_in.save_tanh is save
        x = torch.randn(3, 5, 16, requires_grad=True)
        count = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.append(t.numel()) or t, lambda t: t):
            u, ctx = norms.pre_attn(x)
            v = norms.pre_mlp(x * 2, ctx)
        saved[save] = sum(count)
        results[save] = [u, v, *torch.autograd.grad((u * v).sum(), [x, *norms.parameters()])]
    assert saved[True] == saved[False] + 2 * x.numel()  # each site also saves its tanh
    for a, b in zip(results[False], results[True]):
        torch.testing.assert_close(b, a)
    with pytest.raises(ValueError, match="save_tanh must be true or false, got 'yes'"):
        BHyTScheme(save_tanh="yes")

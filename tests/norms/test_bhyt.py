"""``bhyt`` and ``bhyt_exact``: the float64 reference for the shared per-scheme checks; gradients
(docs/method.md, section 3), the cached constant c, fixed lambdas, exact_layers, the theorem helper; the fused
site (impl="fused") against the reference site."""

from __future__ import annotations

import math

import pytest
import torch
from reference_model import Case, SchemeReference, _p, mlp_ref, rms, vo_constant_ref
from scheme_checks import float64_model

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.bench.memory import saved_activation_bytes
from bhyt_pl.model import Block, rope_cos_sin
from bhyt_pl.norms import BHyT, BHyTScheme, RMSNorm, build_norm_scheme, satisfies_variance_bound, vo_constant


# ----------------------------------------------------------------------------- float64 reference
def bhyt_site(x, site, kappa, eps, stat, spread=None, mean=None):
    """gamma * tanh(lambda * x / D); D from the given (approximated) statistic or exact ones."""
    if stat == "rms":
        m = x.pow(2).mean(-1, keepdim=True) if spread is None else spread
        denom = kappa * torch.sqrt(m + eps)
    else:
        mu = x.mean(-1, keepdim=True) if mean is None else mean
        var = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) if spread is None else spread
        denom = kappa * torch.sqrt(var + eps) + mu.abs()
    return _p(site.weight) * torch.tanh(_p(site.lambda_) * x / denom)


def _kappa(args: dict) -> float:
    return args.get("kappa") or 1.0 / math.sqrt(1.0 - args.get("p", 0.99))


def _reference_block(x, layer, li, model, args, attend, approximate: bool = True):
    """Site A exact; site B from site A's statistic plus ``c * lambda_A^2 / kappa^2`` unless exact here."""
    n, kappa, eps, stat = layer.norms, _kappa(args), args.get("eps", 1e-6), args.get("stat", "rms")
    u = bhyt_site(x, n.attn_in, kappa, eps, stat)
    h = x + attend(u, layer.attn)
    exact_layers = args.get("exact_layers")
    exact_here = li < exact_layers if isinstance(exact_layers, int) else li in (exact_layers or ())
    if approximate and not exact_here:
        lam_a = float(n.attn_in.lambda_.detach())
        corr = vo_constant_ref(layer.attn, args.get("seq_len", 1024)) * lam_a**2 / kappa**2
        if stat == "rms":
            spread, mean = x.pow(2).mean(-1, keepdim=True) + corr, None
        else:
            mean = x.mean(-1, keepdim=True)
            spread = (x - mean).pow(2).mean(-1, keepdim=True) + corr
        v = bhyt_site(h, n.mlp_in, kappa, eps, stat, spread=spread, mean=mean)
    else:
        v = bhyt_site(h, n.mlp_in, kappa, eps, stat)
    return h + mlp_ref(v, layer.mlp)


def _final(x, f, args):
    if args.get("lambda_final", 0) > 0:  # a BHyT final norm with exact statistics
        return bhyt_site(x, f, _kappa(args), args.get("eps", 1e-6), args.get("stat", "rms"))
    return rms(x, f.weight, args.get("final_eps", 1e-5))


REFERENCES = {
    "bhyt": SchemeReference(
        block=_reference_block,
        final=_final,
        cases=(
            Case({"lambda_attn": 1.0, "lambda_final": 1.5, "seq_len": 64}),
            Case({"stat": "meanstd"}),
            Case({"kappa": 4.0, "learnable_lambda": False}),
            Case({"exact_layers": 2}),
            Case({"exact_layers": [2, 0]}),
            Case({"exact_layers": [1], "stat": "meanstd"}),
            Case(overrides={"qk_norm": "head"}),
        ),
    ),
    "bhyt_exact": SchemeReference(
        block=lambda x, layer, li, model, args, attend: _reference_block(
            x, layer, li, model, args, attend, approximate=False
        ),
        final=_final,
        cases=(Case({"stat": "meanstd", "lambda_final": 1.0}),),
    ),
}


# ----------------------------------------------------------------------------- gradients, c, lambdas
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


# ----------------------------------------------------------------------------- exact_layers
def test_bhyt_correction_changes_the_output() -> None:
    """Guard: with a zeroed c the approximation differs, so the formula test above sees c."""
    config = LlamaConfig.from_name("tiny", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, norm="bhyt")
    model = float64_model(config)
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
    model = float64_model(config)
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


# ----------------------------------------------------------------------------- the fused site
def _pair(stat: str, dtype: torch.dtype = torch.float32) -> tuple[BHyT, BHyT]:
    ref = BHyT(48, 2.0, 10.0, 1e-6, stat=stat, impl="reference").to(dtype)
    fused = BHyT(48, 2.0, 10.0, 1e-6, stat=stat, impl="fused").to(dtype)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.lambda_.fill_(1.7)
    fused.load_state_dict(ref.state_dict())
    return ref, fused


def _run(site: BHyT, x: torch.Tensor, g: torch.Tensor, with_stats: bool):
    x = x.detach().clone().requires_grad_(True)
    if with_stats:  # site B: a statistic handed in, with its own gradient path into x
        stats = site.statistics(x)
        stats = stats._replace(spread=stats.spread + 0.3)
        y = site(x, stats)
    else:
        y = site(x)
    y.backward(g)
    return y.detach(), x.grad, site.weight.grad, site.lambda_.grad


@pytest.mark.parametrize("stat", ["rms", "meanstd"])
@pytest.mark.parametrize("with_stats", [False, True])
@pytest.mark.parametrize("compiled_path", [False, True], ids=["eager-function", "compiled-path"])
def test_fused_equals_reference_float32(
    stat: str, with_stats: bool, compiled_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, fused = _pair(stat)
    if compiled_path:  # the Functions and rational tanh the fused path traces while compiling, run eagerly
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert not fused.eager_function()
    x = torch.randn(3, 7, 48) * 4
    g = torch.randn(3, 7, 48)
    for a, b in zip(_run(ref, x, g, with_stats), _run(fused, x, g, with_stats)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_fused_equals_reference_bfloat16() -> None:
    ref, fused = _pair("rms", torch.bfloat16)
    x = (torch.randn(2, 5, 48) * 3).bfloat16()
    g = torch.randn(2, 5, 48).bfloat16()
    for a, b in zip(_run(ref, x, g, False), _run(fused, x, g, False)):
        torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)


def _fused_block(impl: str, dtype: torch.dtype = torch.float64) -> tuple[Block, tuple]:
    config = LlamaConfig(
        dim=8, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=12, vocab_size=16, norm="bhyt", norm_args={"impl": impl}
    )
    block = Block(config, 0, config.norm_scheme()).to(dtype)
    with torch.no_grad():
        for p in block.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.4)
    block.refresh_norm_constants()
    return block, rope_cos_sin(torch.arange(5), config.head_dim, config.rope_theta, dtype)


def test_fused_block_gradcheck_float64() -> None:
    block, (cos, sin) = _fused_block("fused")
    names = ["norms.mlp_in.lambda_", "norms.attn_in.weight", "norms.mlp_in.weight", "attn.v_proj.weight"]
    params = dict(block.named_parameters())

    def f(x, *values):
        return torch.func.functional_call(block, dict(zip(names, values)), (x, cos, sin))

    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    inputs = (x, *[params[n].detach().clone().requires_grad_(True) for n in names])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.slow
def test_fused_block_traces_fullgraph() -> None:
    """dynamo captures the autograd Functions in one graph (aot_eager: no code generation)."""
    torch._dynamo.reset()
    block, (cos, sin) = _fused_block("fused", torch.float32)
    ref, _ = _fused_block("reference", torch.float32)
    ref.load_state_dict(block.state_dict())
    ref.refresh_norm_constants()
    x = torch.randn(2, 5, 8, requires_grad=True)
    out = torch.compile(block, fullgraph=True, backend="aot_eager")(x, cos, sin)
    expected = ref(x, cos, sin)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(out.square().sum(), [x])
    (g_ref,) = torch.autograd.grad(expected.square().sum(), [x])
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)


def test_auto_takes_the_eager_function_on_cpu_only() -> None:
    """``auto`` runs ``BHyTSiteFunction`` eagerly only on the CPU (the device it was measured on); elsewhere
    (here the meta device, standing in for CUDA) the plain-ops path, while ``fused`` keeps the Function."""
    x = torch.randn(3, 8, device="meta", requires_grad=True)
    auto, fused = BHyT(8, 1.0, 10.0, 1e-6).to("meta"), BHyT(8, 1.0, 10.0, 1e-6, impl="fused").to("meta")
    assert not auto.fused() and not auto.eager_function() and fused.eager_function()
    assert type(auto(x).grad_fn).__name__ != "BHyTSiteFunctionBackward"
    assert type(fused(x).grad_fn).__name__ == "BHyTSiteFunctionBackward"


def test_auto_runs_the_function_eager_and_the_fused_ops_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    site = BHyT(8, 1.0, 10.0, 1e-6)
    assert site.impl == "auto" and site.fused() and site.eager_function()
    x = torch.randn(3, 8, requires_grad=True)
    assert type(site(x).grad_fn).__name__ == "BHyTSiteFunctionBackward"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert site.fused() and not site.eager_function()
    reference = BHyT(8, 1.0, 10.0, 1e-6, impl="reference")
    assert not reference.fused() and not reference.eager_function()


def test_fused_saves_no_more_activations_than_rmsnorm() -> None:
    x = torch.randn(64, 256, requires_grad=True)
    fused = BHyT(256, 2.0, 10.0, 1e-6, impl="fused")
    ref = BHyT(256, 2.0, 10.0, 1e-6, impl="reference")
    rms = RMSNorm(256, impl="reference")  # the plain ops (the eager default saves as little as fused BHyT)
    saved = {
        name: saved_activation_bytes(lambda m=m: m(x), m.parameters())
        for name, m in (("fused", fused), ("reference", ref), ("rmsnorm", rms))
    }
    assert saved["fused"] <= saved["rmsnorm"]
    assert saved["fused"] < saved["reference"]
    assert saved["fused"] <= x.nbytes + 4 * 64 * 4  # the input, plus a few float32 scalars per token


def test_impl_is_validated() -> None:
    with pytest.raises(ValueError, match="impl must be one of auto, reference, fused; got 'fast'"):
        BHyT(8, 1.0, 10.0, 1e-6, impl="fast")
    with pytest.raises(ValueError, match="impl must be one of"):
        build_norm_scheme("bhyt", impl="triton")
    with pytest.raises(ValueError, match="impl must be one of"):
        build_norm_scheme("bhyt_exact", impl="")
    scheme = BHyTScheme(impl="fused")
    assert type(scheme)(**scheme.hparams()) == scheme
    assert scheme.block_norms(8, 0, 2).mlp_in.impl == "fused"

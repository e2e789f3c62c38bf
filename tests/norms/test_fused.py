"""BHyT's fused site (impl="fused") equals the reference site; the rational tanh stays within 1e-6."""

from __future__ import annotations

import pytest
import torch

from bhyt_pl import LlamaConfig
from bhyt_pl.bench.memory import saved_activation_bytes
from bhyt_pl.model import Block, rope_cos_sin
from bhyt_pl.norms import BHyT, BHyTScheme, RMSNorm, build_norm_scheme


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


def _block(impl: str, dtype: torch.dtype = torch.float64) -> tuple[Block, tuple]:
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
    block, (cos, sin) = _block("fused")
    names = ["norms.mlp_in.lambda_", "norms.attn_in.weight", "norms.mlp_in.weight", "attn.v_proj.weight"]
    params = dict(block.named_parameters())

    def f(x, *values):
        return torch.func.functional_call(block, dict(zip(names, values)), (x, cos, sin))

    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    inputs = (x, *[params[n].detach().clone().requires_grad_(True) for n in names])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_fused_block_traces_fullgraph() -> None:
    """dynamo captures the autograd Functions in one graph (aot_eager: no code generation)."""
    torch._dynamo.reset()
    block, (cos, sin) = _block("fused", torch.float32)
    ref, _ = _block("reference", torch.float32)
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
    rms = RMSNorm(256, impl="reference")  # the plain ops (the eager default now saves as little as fused BHyT)
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

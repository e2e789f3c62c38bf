"""``rmsnorm``: the eager RMSNorm autograd Function against the reference ops and a float64 formula written
here, and the scheme's float64 reference for the shared per-scheme checks."""

from __future__ import annotations

import pytest
import torch
from reference_model import Case, SchemeReference, pre_ln_block, rms

from bhyt_pl.norms import build_norm_scheme
from bhyt_pl.norms.rmsnorm import RMSNorm, RMSNormFunction

REFERENCES = {
    "rmsnorm": SchemeReference(
        block=lambda x, layer, li, model, args, attend: pre_ln_block(
            x, layer, lambda z, site: rms(z, site.weight, args.get("eps", 1e-5)), attend
        ),
        final=lambda x, f, args: rms(x, f.weight, args.get("eps", 1e-5)),
        cases=(Case(overrides={"qk_norm": "head"}), Case(overrides={"qk_norm": "full"})),
    ),
}


def _formula(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_function_gradcheck_float64() -> None:
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(8, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-5), (x, w))


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_fused_equals_reference_and_formula_in_float64(scale: float) -> None:
    x = torch.randn(4, 7, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 7, 16, dtype=torch.float64)
    outs, grads = {}, {}
    for impl in ("fused", "reference"):
        norm = RMSNorm(16, eps=1e-5, scale=scale, impl=impl).double()
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, 16, dtype=torch.float64))
        outs[impl] = norm(x)
        grads[impl] = torch.autograd.grad(outs[impl], (x, norm.weight), g)
    w = torch.linspace(0.5, 1.5, 16, dtype=torch.float64).requires_grad_()
    want = _formula(x, w, 1e-5) * scale
    torch.testing.assert_close(outs["fused"], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs["fused"], outs["reference"], rtol=1e-12, atol=1e-12)
    formula_grads = torch.autograd.grad(want, (x, w), g)
    for a, b, c in zip(grads["fused"], grads["reference"], formula_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_fused_matches_reference_in_float32_and_bfloat16() -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = torch.randn(64, 32).to(dtype).requires_grad_()
        g = torch.randn(64, 32).to(dtype)
        res = {}
        for impl in ("fused", "reference"):
            norm = RMSNorm(32, impl=impl).to(dtype)
            y = norm(x)
            res[impl] = (y, *torch.autograd.grad(y, (x, norm.weight), g))
        for a, b in zip(res["fused"], res["reference"]):
            assert a.dtype == b.dtype == dtype
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 4)


def test_impl_is_validated_and_reaches_every_site() -> None:
    with pytest.raises(ValueError, match="impl must be one of auto, reference, fused"):
        build_norm_scheme("rmsnorm", impl="fast")
    scheme = build_norm_scheme("rmsnorm", impl="reference")
    assert scheme.block_norms(8, 0, 2).attn_in.impl == "reference" and scheme.final_norm(8, 2).impl == "reference"
    assert RMSNorm(8).impl == "auto"

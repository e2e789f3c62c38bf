"""The chunked cross-entropy against the plain loss written here: values and gradients in float64,
float32 within tolerance, ignored labels, every reduction, through the model, and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.loss import default_chunk_tokens, linear_cross_entropy


def _reference(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    logits = (h @ w.t()).to(torch.promote_types(h.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, -2), y.flatten(), ignore_index=-100, reduction=reduction)


def _inputs(dtype: torch.dtype, n: int = 23, d: int = 16, v: int = 37):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[[0, 5, 6, n - 1]] = -100
    return h, w, y


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [1, 5, 23, 100])
def test_chunked_equals_plain_loss_and_gradients_in_float64(reduction: str, chunk: int) -> None:
    h, w, y = _inputs(torch.float64)
    out = linear_cross_entropy(h, w, y, impl="chunked", chunk_tokens=chunk, reduction=reduction)
    ref = _reference(h, w, y, reduction)
    if reduction == "none":
        ref = ref.masked_fill(y == -100, 0.0)
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-12)
    assert out.tokens == (y != -100).sum() == 19
    seed = torch.randn_like(ref)  # a non-uniform upstream gradient for "none"
    got = torch.autograd.grad((out.loss * seed).sum(), (h, w))
    want = torch.autograd.grad((ref * seed).sum(), (h, w))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_chunked_gradcheck_float64() -> None:
    h, w, y = _inputs(torch.float64, n=7, d=4, v=9)
    y[2] = -100
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, y, impl="chunked", chunk_tokens=3).loss, (h, w)
    )


def test_chunked_matches_plain_in_float32_and_bfloat16() -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        h, w, y = _inputs(dtype, n=64, d=32, v=500)
        out = linear_cross_entropy(h, w, y, impl="chunked", chunk_tokens=10)
        ref = linear_cross_entropy(h, w, y, impl="plain")
        torch.testing.assert_close(out.loss, ref.loss, rtol=tol, atol=tol)
        got = torch.autograd.grad(out.loss, (h, w))
        want = torch.autograd.grad(ref.loss, (h, w))
        for a, b in zip(got, want):
            assert a.dtype == dtype
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * 1e-1)


def test_under_bf16_autocast_matches_plain_logits_loss() -> None:
    """bf16-mixed training: the loss and float32 weight gradients equal autocast's F.linear + cross-entropy."""
    h, w, y = _inputs(torch.float32, n=48, d=32, v=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(h, w, y, impl="chunked", chunk_tokens=7)
        ref = F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-100)
    got, want = torch.autograd.grad(out.loss, (h, w)), torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(out.loss, ref, rtol=1e-3, atol=1e-3)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_all_labels_ignored_gives_nan_mean_like_cross_entropy() -> None:
    h, w, y = _inputs(torch.float64)
    y[:] = -100
    out = linear_cross_entropy(h, w, y, impl="chunked", chunk_tokens=4)
    assert out.tokens == 0 and torch.isnan(out.loss) and torch.isnan(_reference(h, w, y, "mean"))


def test_bad_arguments_name_the_field() -> None:
    h, w, y = _inputs(torch.float32)
    with pytest.raises(ValueError, match="loss impl must be one of auto, chunked, liger, plain"):
        linear_cross_entropy(h, w, y, impl="fused")
    with pytest.raises(ValueError, match="'liger' needs a CUDA device"):
        linear_cross_entropy(h, w, y, impl="liger")
    with pytest.raises(ValueError, match="reduction must be one of"):
        linear_cross_entropy(h, w, y, reduction="avg")
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        linear_cross_entropy(h, w, y, chunk_tokens=0)
    with pytest.raises(ValueError, match="labels .* must match"):
        linear_cross_entropy(h, w, y[:-1])
    assert default_chunk_tokens(128256) == 261 and default_chunk_tokens(8192) == 4096


def _model64(tie: bool = True) -> Llama:
    config = LlamaConfig(
        vocab_size=61, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, mlp_dim=24, max_seq_len=32, tie_embeddings=tie
    )
    torch.manual_seed(0)
    return Llama(config).double()


@pytest.mark.parametrize("tie", [True, False])
def test_model_forward_with_labels_equals_loss_of_logits(tie: bool) -> None:
    model = _model64(tie)
    model.loss_chunk_tokens = 7  # several chunks, the last one partial (2 x 11 = 22 tokens)
    idx = torch.randint(0, 61, (2, 11))
    labels = idx.roll(-1, dims=1)
    labels[:, -1] = -100
    out = model(idx, labels=labels)
    got = torch.autograd.grad(out.loss, list(model.parameters()))
    ref = F.cross_entropy(model(idx).flatten(0, 1), labels.flatten(), ignore_index=-100)
    want = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(out.loss, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_compiled_model_loss_and_gradients_equal_eager() -> None:
    """The whole model, loss included, captured as one graph with autograd (aot_eager: inductor's code
    generation of a whole model costs about a minute on 2 cores and adds nothing to the capture)."""
    torch._dynamo.reset()
    model = _model64()
    model.loss_chunk_tokens = 8
    idx = torch.randint(0, 61, (2, 12))
    labels = idx.roll(-1, dims=1)
    labels[0, :4] = -100
    eager = model(idx, labels=labels).loss
    want = torch.autograd.grad(eager, list(model.parameters()))
    compiled = torch.compile(model, dynamic=False, fullgraph=True, backend="aot_eager")
    out = compiled(idx, labels=labels)
    got = torch.autograd.grad(out.loss, list(model.parameters()))
    torch.testing.assert_close(out.loss, eager, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

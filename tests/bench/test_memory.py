"""``bhyt_pl.bench.memory``: saved-activation bytes counted by storage, once each, parameters excluded."""

from __future__ import annotations

import math

import pytest
import torch

from bhyt_pl.bench.memory import STEP_SIDES, measure_step_peak, saved_activation_bytes, step_peak_memory


def test_saved_bytes_of_hand_countable_graphs() -> None:
    x = torch.randn(10, 10, requires_grad=True)  # 400 bytes
    w = torch.nn.Parameter(torch.randn(10, 10))
    assert saved_activation_bytes(lambda: torch.exp(x)) == 400  # exp saves its result
    assert saved_activation_bytes(lambda: x * x) == 400  # x saved twice, one storage
    assert saved_activation_bytes(lambda: x @ w) == 800  # both inputs
    assert saved_activation_bytes(lambda: x @ w, exclude=[w]) == 400  # the parameter is no activation
    assert saved_activation_bytes(lambda: torch.exp(x.double())) == 800  # a float64 result
    assert saved_activation_bytes(lambda: x + x) == 0  # addition saves nothing
    with torch.no_grad():
        assert saved_activation_bytes(lambda: torch.exp(x)) == 0


def test_views_share_their_storage() -> None:
    x = torch.randn(8, 8, requires_grad=True)

    def two_views_saved() -> torch.Tensor:
        y = torch.exp(x)  # saves y (256 bytes)
        return torch.sin(y[:4]) + torch.sin(y[4:])  # sin saves its inputs, views of y's storage

    assert saved_activation_bytes(two_views_saved) == 256


def test_step_peak_memory_refuses_an_unknown_side_before_starting_a_process() -> None:
    sides = ", ".join(STEP_SIDES)
    with pytest.raises(ValueError, match=f"unknown step-memory side 'liger'; sides: {sides}"):
        step_peak_memory(["liger"], "tiny", {}, 1, 8, "float32", "cpu", 1)


def test_saved_activation_bytes_counts_storages_once_and_skips_parameters() -> None:
    w = torch.nn.Parameter(torch.ones(16))
    x = torch.randn(4, 16, requires_grad=True)
    assert saved_activation_bytes(lambda: torch.exp(x), []) == x.nbytes  # exp saves its output
    assert saved_activation_bytes(lambda: x * x, []) == x.nbytes  # one storage, saved twice
    assert saved_activation_bytes(lambda: x * w, [w]) == x.nbytes  # the parameter is not counted


def test_chunked_loss_saves_no_full_logits_for_backward() -> None:
    """What backward keeps is what the step's peak memory grows by: counted exactly with saved-tensor hooks
    (in-process RSS is too noisy for a test; the bench measures RSS with each side in its own process).
    At a vocabulary of 32768 the plain loss keeps 256 x 32768 float32 logits (32 MiB); the chunked loss
    keeps the hidden states and recomputes one chunk of 32 tokens at a time in backward."""
    from bhyt_pl import Llama, LlamaConfig

    overrides = {"n_layers": 1, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "mlp_dim": 32, "vocab_size": 32768}
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", **overrides))
    idx = torch.randint(0, 32768, (1, 256))
    labels = torch.randint(0, 32768, (1, 256))

    def saved_bytes(impl: str) -> tuple[int, float]:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        model.loss_impl, model.loss_chunk_tokens = impl, 32
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}  # held anyway, not step memory
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(idx, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(n for ptr, n in storages.items() if ptr not in params), loss.item()

    chunked, chunked_loss = saved_bytes("chunked")
    plain, plain_loss = saved_bytes("plain")
    assert chunked_loss == pytest.approx(plain_loss, rel=1e-5)
    logits_bytes = 256 * 32768 * 4
    assert plain >= logits_bytes
    assert chunked < logits_bytes / 8
    # the bench's own measurement of one side runs and computes the same loss (its RSS figures are the bench's)
    spec = {"preset": "tiny", "overrides": overrides, "batch": 1, "seq_len": 256, "dtype": "float32",
            "device": "cpu", "threads": 1, "loss_chunk_tokens": 32, "side": "chunked"}  # fmt: skip
    measured = measure_step_peak(spec)
    assert measured["peak_growth_bytes"] > 0 and math.isfinite(measured["loss"])

"""``bhyt_pl.bench.memory``: saved-activation bytes counted by storage, once each, parameters excluded."""

from __future__ import annotations

import torch

from bhyt_pl.bench.memory import STEP_SIDES, saved_activation_bytes


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


def test_step_sides_name_the_three_measured_losses() -> None:
    assert STEP_SIDES == ("chunked", "plain", "hf_transformers")

"""``bhyt_pl.bench.memory``: saved-activation bytes counted by storage, once each, parameters excluded."""

from __future__ import annotations

import pytest
import torch

from bhyt_pl.bench.memory import STEP_SIDES, saved_activation_bytes, step_peak_memory


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

"""``bhyt_pl.bench.tanh``: the relative-error measure and the formulations it compares."""

from __future__ import annotations

import math

import pytest
import torch

from bhyt_pl.bench.tanh import FORMULATIONS, dense_grid, max_relative_error, tanh_table


def test_max_relative_error_of_a_known_perturbation() -> None:
    z = torch.tensor([-3.0, -0.5, 0.0, 0.25, 2.0])
    assert max_relative_error(torch.tanh, z) == pytest.approx(0.0, abs=1e-7)
    assert max_relative_error(lambda t: torch.tanh(t) * 1.001, z) == pytest.approx(1e-3, rel=1e-3)  # 0/0 is 0
    assert max_relative_error(lambda t: t, torch.tensor([0.5])) == pytest.approx(0.5 / math.tanh(0.5) - 1, rel=1e-6)


def test_the_grid_covers_the_line_and_the_formulations_are_tanh() -> None:
    grid = dense_grid()
    assert grid.dtype == torch.float32 and grid.min() == -math.inf and grid.max() == math.inf
    assert (grid.abs() == 1e-30).any() and (grid == 0).any()
    z = torch.linspace(-5, 5, 101)
    for name, f in FORMULATIONS.items():
        torch.testing.assert_close(f(z), torch.tanh(z), atol=2e-6, rtol=0, msg=name)
    # near zero, 2*sigmoid(2z)-1 loses relative accuracy; the rational form used by BHyT does not
    small = torch.logspace(-8, -3, 50)
    assert max_relative_error(FORMULATIONS["2*sigmoid(2z)-1"], small) > 1e-2
    assert max_relative_error(FORMULATIONS["rational [13/6]"], small) < 1e-5


def test_tanh_table_reports_time_and_error_per_formulation() -> None:
    table = tanh_table((256,), repeats=2, compile=False)
    assert set(table) == set(FORMULATIONS)
    for name, row in table.items():
        assert set(row) == {"max_rel_error", "eager_ms"} and row["eager_ms"] > 0
        assert row["max_rel_error"] == max_relative_error(FORMULATIONS[name], dense_grid())

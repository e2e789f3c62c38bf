"""Fixtures the confirmation's tests share: a synthetic pilot (``study_fixtures.write_pilot``) and its plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_fixtures import write_pilot

from bhyt_pl.study.cli import confirmation_plan as confirm
from bhyt_pl.study.cli.confirmation_plan import load_pilot
from bhyt_pl.study.protocol import power_plan


@pytest.fixture
def pilot(tmp_path: Path) -> confirm.Pilot:
    return load_pilot(write_pilot(tmp_path / "pilot"))


@pytest.fixture
def plan(pilot: confirm.Pilot) -> power_plan.Plan:
    return confirm.make_confirmation_plan(pilot, pilot.rate(), max_seeds=12)

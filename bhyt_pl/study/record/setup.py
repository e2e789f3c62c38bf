"""A study's resolved setup, as its record holds it: what every run shared, so a later stage trains with exactly
that instead of re-parsing the study's command line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from bhyt_pl.study.protocol.spec import TrainerSettings
from bhyt_pl.study.run.data import StudyData, fixed_batches

__all__ = ["RecordedSetup"]


@dataclass(frozen=True)
class RecordedSetup:
    """What every run of a study shared, resolved: a later stage (the confirmation) trains with exactly this.

    Args:
        data: every run's data module setting (each run shuffles with its own data seed).
        val_batches: how many fixed validation batches every run is measured on.
        settings: how every run executed (accelerator, devices, precision, compile).
        roles: claim role -> scheme group.
        source: where it came from: ``recorded`` by the study itself, or how a converter rebuilt it.
    """

    data: StudyData
    val_batches: int
    settings: TrainerSettings
    roles: dict[str, str] = field(default_factory=dict)
    source: str = "recorded"

    def validation_batches(self, data_seed: int) -> list[dict[str, torch.Tensor]]:
        """The fixed validation batches (from ``data_seed``'s data module: the study's base data seed)."""
        return fixed_batches(self.data(data_seed), self.val_batches)

    def to_dict(self) -> dict[str, object]:
        return {
            "data": asdict(self.data),
            "val_batches": self.val_batches,
            "settings": asdict(self.settings),
            "roles": dict(self.roles),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedSetup:
        return cls(
            data=StudyData(**data["data"]),
            val_batches=int(data["val_batches"]),
            settings=TrainerSettings(**data["settings"]),
            roles=dict(data.get("roles") or {}),
            source=str(data.get("source", "recorded")),
        )

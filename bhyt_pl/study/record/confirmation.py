"""A confirmation's record: how it ran (``meta``), the frozen plan and its runs, with the verdicts as evaluated when it
was written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bhyt_pl.strict_json import loads
from bhyt_pl.study.protocol import power
from bhyt_pl.study.protocol.confirmation import Evaluation, evaluate
from bhyt_pl.study.protocol.spec import RunResult

__all__ = ["KIND", "ConfirmationRecord", "load"]

KIND = "confirmation"
"""``meta["kind"]`` of a confirmation's ``results.json`` (an exploration's record has none)."""


@dataclass
class ConfirmationRecord:
    """What a confirmation's ``results.json`` holds, typed: how it ran (``meta``), the frozen plan and its runs."""

    meta: dict[str, Any]
    plan: power.Plan
    runs: list[RunResult] = field(default_factory=list)

    def evaluate(self) -> Evaluation:
        return evaluate(self.plan, self.runs, int(self.meta.get("tokens_per_step", 0)))

    def to_dict(self, evaluation: Evaluation | None = None) -> dict[str, Any]:
        """The JSON document: ``meta``, the ``plan``, the ``family`` (per primary test its runs, plan row, one-sided
        p, Holm p and verdict), the ``paper_claims``, the ``exploratory`` rows with their reasons and seed counts,
        the rows ``not_tested``, then every run."""
        evaluation = evaluation or self.evaluate()
        return {
            "meta": self.meta,
            "plan": self.plan.to_dict(),
            "family": [t.to_dict() for t in evaluation.tests],
            "paper_claims": [c.to_dict() for c in evaluation.claims],
            "exploratory": [
                {
                    "name": t.name,
                    "statistic": t.statistic,
                    "rule": t.rule,
                    "margin": t.margin,
                    "rate": t.rate,
                    "status": t.status,
                    "reason": t.reason,
                    "pilot": {"n": t.pilot_n, "mean": t.pilot_mean, "low_80": t.pilot_low, "high_80": t.pilot_high},
                    "level": t.level,
                    "seeds_at_80_percent_power": t.seeds,
                    "plug_in_seeds": t.plug_in_seeds,
                }
                for t in self.plan.tests
                if not t.primary
            ],
            "not_tested": list(self.plan.source.get("not_tested", [])),
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfirmationRecord:
        """The record ``to_dict`` wrote (the verdicts are left out: they are evaluated again)."""
        missing = [key for key in ("meta", "plan", "runs") if key not in data]
        if missing or data["meta"].get("kind") != KIND:
            raise ValueError(
                f"not a confirmation's record (meta kind {data.get('meta', {}).get('kind')!r}, missing {missing})"
            )
        return cls(
            dict(data["meta"]), power.Plan.from_dict(data["plan"]), [RunResult.from_dict(r) for r in data["runs"]]
        )


def load(path: str | Path) -> ConfirmationRecord:
    """The confirmation's record in ``path`` (its ``results.json`` or the folder holding it)."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    try:
        data = loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the confirmation's record {str(path)!r}: {exc}") from exc
    return ConfirmationRecord.from_dict(data)

"""The confirmation's power plan as text (``render``): what the confirmation prints before its first run, so the
reader sees the family, each test's pilot summary and assumptions, and the seeds each group trains."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bhyt_pl.study.protocol.power_plan import Plan

__all__ = ["render"]


def render(plan: Plan) -> str:
    """``plan`` as text to print before the runs (markdown tables): every candidate's row, the paper-level claims
    and the seeds each group trains."""
    lines = [
        f"Confirmation plan (frozen before any run): one-sided paired t-tests, Holm across the {plan.family_size} "
        f"primary tests at alpha {plan.alpha:g}; each planned at alpha / {max(plan.family_size, 1)} = "
        f"{plan.level:.3g} for power {plan.power:g}, with the effect shrunk to the pilot's "
        f"{plan.shrink_confidence:.0%} bound nearer the boundary and the SD inflated to its one-sided "
        f"{plan.sd_confidence:.0%} upper bound; {plan.min_seeds} to {plan.max_seeds} seeds a test.",
        "",
        "| test | statistic | rule | pilot n | pilot mean [80 %] | pilot SD | shrunk effect | inflated SD | level "
        "| seeds | pairs | power | plug-in seeds | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in plan.tests:
        rule = t.rule + (f" {t.margin:g}" if t.rule in ("no_worse", "equivalent") else "")
        status = t.status + (f": {t.reason}" if t.reason else "")
        lines.append(
            f"| {t.name} | {t.statistic} | {rule} | {t.pilot_n} | {t.pilot_mean:+.3f} [{t.pilot_low:+.3f}, "
            f"{t.pilot_high:+.3f}] | {t.pilot_sd:.3f} | {t.effect:+.3f} | {t.sd:.3f} | {t.level:.3g} | "
            f"{_count(t.seeds)} | {t.pairs or '-'} | {_num(t.power)} | {_count(t.plug_in_seeds)} | {status} |"
        )
    if plan.claims:
        lines += [
            "",
            "| paper-level claim (intersection-union) | components | seeds | joint power | status |",
            "|---|---|---|---|---|",
        ]
        for c in plan.claims:
            status = c.status + (f": {c.reason}" if c.reason else "")
            lines.append(
                f"| {c.name} | {'; '.join(c.components)} | {_count(c.seeds)} | {_num(c.joint_power)} | {status} |"
            )
    pilot = f"the pilot used {_indices(plan.pilot_seed_indices)}"
    if not plan.group_seeds:
        return "\n".join(lines + ["", f"No test is in the family: the confirmation trains nothing ({pilot})."])
    seeds = ", ".join(f"{g} {n}" for g, n in plan.group_seeds.items())
    override = f" (--seeds {plan.seeds_override} overrides the plan's counts)" if plan.seeds_override else ""
    last = plan.first_seed_index + max(plan.group_seeds.values()) - 1
    lines += [
        "",
        f"Seeds per group{override}: {seeds}; {plan.runs} runs, seed indices {plan.first_seed_index}..{last} "
        f"({pilot}).",
    ]
    return "\n".join(lines)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _num(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.3f}"


def _indices(indices: Sequence[int]) -> str:
    return f"{min(indices)}..{max(indices)}" if indices else "none"

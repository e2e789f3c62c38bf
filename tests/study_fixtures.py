"""Study values built by hand for tests: a design whose groups kept the given candidates and rates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bhyt_pl.study.design import SchemeGroup, Selection, StudyDesign
from bhyt_pl.study.runner import RunResult, RunSpec
from bhyt_pl.variants import Variant


def kept_design(
    best: Mapping[str, float], matched_lrs: Sequence[float] = (), candidates: Mapping[str, str] | None = None
) -> StudyDesign:
    """A finished selection: group ``g`` kept candidate ``candidates.get(g, g)`` at rate ``best[g]`` (its one
    selection run carries no measurement; the claims and tables read the evaluation runs)."""
    groups, selections = [], {}
    for group, lr in best.items():
        candidate = (candidates or {}).get(group, group)
        groups.append(SchemeGroup(group, "rmsnorm", (Variant(candidate, "rmsnorm"),)))
        spec = RunSpec(label=f"{candidate}@lr{lr:g}-s0", norm="rmsnorm", group=group, candidate=candidate, lr=lr)
        chosen = RunResult(spec)
        selections[group] = Selection(group, chosen, (chosen,))
    return StudyDesign(tuple(groups), selections=selections, matched_lrs=tuple(matched_lrs))

"""The study's design as one typed value: its scheme groups, its learning-rate grid and seeds, what the protocol
chose for each group, the matched rates, and the runs found by key.

A ``--schemes`` entry is a ``SchemeGroup``: its text ``name[:key=value,...]``, where a value written
``v1|v2|...`` is a grid over that option (several grid options: every combination), e.g.
``dyt:alpha_attn=0.5|1.0|2.0``; every grid point is a candidate. ``StudyDesign`` holds the groups, the grid,
the number of evaluation seeds, each group's ``Selection`` and the matched rates; ``results.json`` records it
(``to_dict``) and ``--report-from`` reads it back (``from_dict``).

Runs are found by their ``RunKey`` (group, candidate, rate, seed index), the rate written as run labels write
it (``rate_key``: ``0.003``, ``0.000333333``), never by comparing learning rates as floats. The design sits
below the protocol, the claims, the report and the command, which all read it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.variants import Variant, parse_variant, split_options

__all__ = [
    "RunKey",
    "SchemeGroup",
    "Selection",
    "StudyDesign",
    "StudyRuns",
    "check_disjoint",
    "parse_group",
    "rate_key",
]


def rate_key(lr: float) -> str:
    """The canonical text of a learning rate, as run labels write it (``f"{lr:g}"``: ``0.003``, ``1e-05``)."""
    return f"{lr:g}"


@dataclass(frozen=True, order=True)
class RunKey:
    """What identifies a run of a depth study: its group, its candidate, its rate (``rate_key``) and its seed
    index. Two runs with one key are one run (the protocol's arms share them)."""

    group: str
    candidate: str
    rate: str
    seed_index: int

    @classmethod
    def of(cls, spec: RunSpec) -> RunKey:
        return cls(spec.group, spec.candidate, rate_key(spec.lr), spec.seed_index)


class StudyRuns:
    """The runs of one depth study, found by key or by label (built once; the order of ``results`` kept).

    Args:
        results: the runs; two with the same key are refused (their labels would be the same too).
    """

    def __init__(self, results: Iterable[RunResult]) -> None:
        self.results = list(results)
        self._by_key: dict[RunKey, RunResult] = {}
        self._by_label: dict[str, RunResult] = {}
        self._seeds: dict[tuple[str, str, str], dict[int, RunResult]] = {}
        for r in self.results:
            key = RunKey.of(r.spec)
            if key in self._by_key:
                raise ValueError(f"two runs with key {key}: {self._by_key[key].spec.label!r} and {r.spec.label!r}")
            self._by_key[key] = r
            self._by_label[r.spec.label] = r
            self._seeds.setdefault((key.group, key.candidate, key.rate), {})[key.seed_index] = r

    def __iter__(self) -> Iterator[RunResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def get(self, key: RunKey) -> RunResult | None:
        return self._by_key.get(key)

    def labelled(self, label: str) -> RunResult | None:
        """The run with this label, None when the study has none."""
        return self._by_label.get(label)

    def by_label(self) -> dict[str, RunResult]:
        return dict(self._by_label)

    def seeds(self, group: str, candidate: str, lr: float) -> dict[int, RunResult]:
        """``{seed index: run}`` of ``group``'s ``candidate`` at ``lr``, the selection seed included."""
        return dict(self._seeds.get((group, candidate, rate_key(lr)), {}))

    def evaluation(self, group: str, candidate: str, lr: float) -> list[RunResult]:
        """The evaluation-seed runs (seed index >= 1) of ``group``'s ``candidate`` at ``lr``, by seed index."""
        runs = self._seeds.get((group, candidate, rate_key(lr)), {})
        return [runs[i] for i in sorted(runs) if i >= 1]


@dataclass(frozen=True)
class SchemeGroup:
    """One ``--schemes`` entry: its text (the label of every table row) and its grid candidates."""

    label: str
    norm: str
    candidates: tuple[Variant, ...]

    def candidate(self, label: str) -> Variant:
        """The candidate with this label (``ValueError`` naming the group's candidates otherwise)."""
        for v in self.candidates:
            if v.label == label:
                return v
        known = [v.label for v in self.candidates]
        raise ValueError(f"group {self.label!r} has no candidate {label!r}; its candidates: {known}")


def parse_group(text: str) -> SchemeGroup:
    """``"dyt:alpha_attn=0.5|1.0,bias=True"`` -> a group with two candidates; each is built once to validate it."""
    name, _, rest = text.partition(":")
    options = [item for item in split_options(rest) if item]
    choices = []
    for item in options:
        key, eq, value = item.partition("=")
        if not eq:
            parse_variant(text)  # raises the scheme parser's error naming the option
        choices.append([f"{key}={v}" for v in value.split("|")])
    candidates = []
    for combo in itertools.product(*choices):
        variant = parse_variant(name + (":" + ",".join(combo) if combo else ""))
        candidates.append(variant)
    return SchemeGroup(text, candidates[0].norm, tuple(candidates))


def check_disjoint(groups: Sequence[SchemeGroup]) -> None:
    """Raise ``ValueError`` when a candidate belongs to two groups: its runs would have the same labels, so the
    second group's runs would be dropped as duplicates and it would never be selected."""
    owner: dict[str, str] = {}
    problems = []
    for g in groups:
        for v in g.candidates:
            first = owner.setdefault(v.label, g.label)
            if first != g.label:
                problems.append(f"candidate {v.label!r} is in both group {first!r} and group {g.label!r}")
    if problems:
        raise ValueError(
            "--schemes: " + "; ".join(problems) + "; give each candidate in one group only (drop it from one entry)"
        )


@dataclass(frozen=True)
class Selection:
    """A group's choice on the selection seed.

    Args:
        group: the group label.
        chosen: the kept selection run (None when every selection run diverged or failed).
        runs: the group's selection runs (candidates x rates, and the extensions).
        extensions: the rates added beyond the grid, highest first.
        edge: ``"lowest"`` / ``"highest"`` when the kept rate is still at that end of its candidate's tried
            rates (the best rate may lie beyond), ``"single rate"`` when its candidate tried one rate, else ``""``.
    """

    group: str
    chosen: RunResult | None
    runs: tuple[RunResult, ...]
    extensions: tuple[float, ...] = ()
    edge: str = ""

    @property
    def budget(self) -> int:
        """Selection runs spent on the group (candidates x rates + extensions)."""
        return len(self.runs)

    @property
    def lr(self) -> float:
        return self.chosen.spec.lr if self.chosen is not None else math.nan

    @property
    def candidate(self) -> str:
        return self.chosen.spec.candidate if self.chosen is not None else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "candidate": self.candidate,
            "lr": self.lr if self.chosen is not None else None,
            "run": self.chosen.spec.label if self.chosen is not None else None,
            "budget": self.budget,
            "selection_runs": [r.spec.label for r in self.runs],
            "extensions": list(self.extensions),
            "edge": self.edge,
        }

    @classmethod
    def from_dict(cls, group: str, data: Mapping[str, Any], runs: StudyRuns) -> Selection:
        """The selection ``to_dict`` wrote, its runs found by label in ``runs``."""
        labels = ([data["run"]] if data["run"] is not None else []) + list(data["selection_runs"])
        missing = [label for label in labels if runs.labelled(label) is None]
        if missing:
            raise ValueError(f"design: group {group!r} names runs that are not among the study's runs: {missing}")
        return cls(
            group,
            runs.labelled(data["run"]) if data["run"] is not None else None,
            tuple(runs.labelled(label) for label in data["selection_runs"]),
            tuple(float(lr) for lr in data["extensions"]),
            data["edge"],
        )


@dataclass
class StudyDesign:
    """A depth study's design: what it compares (groups, grid, seeds) and what the protocol chose (selections,
    matched rates). The protocol fills ``selections`` and the matched rates in place as it goes, so a report
    written meanwhile sees what is decided so far.

    Args:
        groups: the ``--schemes`` groups, in order (the order of every table).
        lrs: the learning-rate grid of the selection seed (``--lrs``).
        n_seeds: evaluation seeds per group and rate (indices ``1 .. n_seeds``).
        extensions: grid steps a group may add past an edge of ``lrs`` (``--extensions``).
        selections: group label -> its ``Selection`` (a group is missing until its selection is complete).
        matched_lrs: the rates every group trains at with the evaluation seeds.
        matched_note: how the matched rates were set.
    """

    groups: tuple[SchemeGroup, ...]
    lrs: tuple[float, ...] = ()
    n_seeds: int = 0
    extensions: int = 0
    selections: dict[str, Selection] = field(default_factory=dict)
    matched_lrs: tuple[float, ...] = ()
    matched_note: str = ""

    def __post_init__(self) -> None:
        self.groups = tuple(self.groups)
        labels = [g.label for g in self.groups]
        if len(set(labels)) != len(labels):
            raise ValueError(f"design: groups repeat: {labels}")
        unknown = sorted(set(self.selections) - set(labels))
        if unknown:
            raise ValueError(f"design: selections of unknown groups {unknown}; groups: {labels}")

    @property
    def complete(self) -> bool:
        """Every group has its selection (the matched arm can start)."""
        return len(self.selections) == len(self.groups)

    def group(self, label: str) -> SchemeGroup:
        for g in self.groups:
            if g.label == label:
                return g
        raise ValueError(f"design: no group {label!r}; groups: {[g.label for g in self.groups]}")

    def kept(self, group: str) -> Selection | None:
        """``group``'s selection when it kept a candidate (None before its selection, or when none trained)."""
        s = self.selections.get(group)
        return s if s is not None and s.chosen is not None else None

    def evaluation_runs(self, runs: StudyRuns, group: str, lr: float | None = None) -> list[RunResult]:
        """The evaluation-seed runs of ``group``'s kept candidate at ``lr`` (default: its best rate), by seed
        index; empty before its selection."""
        s = self.kept(group)
        if s is None:
            return []
        return runs.evaluation(group, s.candidate, s.lr if lr is None else lr)

    @property
    def depth_lr(self) -> float | None:
        """The rate depth profiles compare every group at: the highest matched rate (depth statistics grow with the
        learning rate, so profiles at different rates would compare the rates), None without one."""
        return max(self.matched_lrs) if self.matched_lrs else None

    def to_dict(self) -> dict[str, object]:
        """The design as ``results.json`` records it; runs are named by their labels."""
        return {
            "groups": [g.label for g in self.groups],
            "lrs": list(self.lrs),
            "seeds": self.n_seeds,
            "extensions": self.extensions,
            "matched_lrs": list(self.matched_lrs),
            "matched_note": self.matched_note,
            "selections": {g: s.to_dict() for g, s in self.selections.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], runs: StudyRuns) -> StudyDesign:
        """The design ``to_dict`` wrote, its runs found in ``runs``; groups are parsed again (their schemes must
        be registered)."""
        missing = [key for key in ("groups", "lrs", "seeds", "extensions", "selections") if key not in data]
        if missing:
            raise ValueError(f"design: missing {missing}; a design has {sorted(cls.__dataclass_fields__)}")
        return cls(
            groups=tuple(parse_group(label) for label in data["groups"]),
            lrs=tuple(float(lr) for lr in data["lrs"]),
            n_seeds=int(data["seeds"]),
            extensions=int(data["extensions"]),
            selections={g: Selection.from_dict(g, s, runs) for g, s in data["selections"].items()},
            matched_lrs=tuple(float(lr) for lr in data.get("matched_lrs", ())),
            matched_note=str(data.get("matched_note", "")),
        )

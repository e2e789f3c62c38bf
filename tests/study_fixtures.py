"""Study values built by hand for tests: runs with set losses and depth profiles, a design whose groups kept the
given candidates and rates, and a two-group result set whose claims are worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bhyt_pl.study.protocol.design import SchemeGroup, Selection, StudyDesign
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.variants import Variant

BASE = RunSpec(label="base", norm="rmsnorm", seed=42, data_seed=42)


def profile_stats(magnitude: Sequence[float], variance: Sequence[float]) -> dict[str, float]:
    """Flat per-layer statistics as ``DepthStatsCollector`` writes them; the median token is half the mean."""
    out = {f"magnitude/layer_{i:02d}": v for i, v in enumerate(magnitude)}
    out.update({f"variance/layer_{i:02d}": v for i, v in enumerate(variance)})
    out.update({f"median_magnitude/layer_{i:02d}": v / 2 for i, v in enumerate(magnitude)})
    return out


def _point(step: int, magnitude: list[float], variance: list[float], val_loss: float) -> dict:
    return {"step": step, "magnitude": magnitude, "variance": variance, "val_loss": val_loss}


def fake_result(spec: RunSpec, loss: float, magnitude: list[float] | None = None, status: str = "ok") -> RunResult:
    """A finished run: validation loss ``loss``, last-layer profile ``magnitude`` (variance its square), a
    trajectory of two points (step 0 all ones, step 10 the end)."""
    magnitude = magnitude or [1.0, 2.0, 3.0, 4.0]
    variance = [m * m for m in magnitude]
    trajectory = [_point(0, [1.0] * len(magnitude), [1.0] * len(magnitude), 10.0)]
    trajectory.append(_point(10, magnitude, variance, loss))
    return RunResult(
        spec=spec,
        status=status,
        n_layers=len(magnitude),
        dim=16,
        steps_done=10,
        val_loss=loss if status == "ok" else math.nan,
        depth_final=profile_stats(magnitude, variance),
        trajectory=trajectory,
    )


def kept_design(
    best: Mapping[str, float],
    matched_lrs: Sequence[float] = (),
    candidates: Mapping[str, str] | None = None,
    edges: Mapping[str, str] | None = None,
) -> StudyDesign:
    """A finished selection: group ``g`` kept candidate ``candidates.get(g, g)`` at rate ``best[g]``, flagged at
    ``edges.get(g)`` (its one selection run carries no measurement; the claims and tables read the evaluation
    runs)."""
    groups, selections = [], {}
    for group, lr in best.items():
        candidate = (candidates or {}).get(group, group)
        groups.append(SchemeGroup(group, "rmsnorm", (Variant(candidate, "rmsnorm"),)))
        spec = RunSpec(label=f"{candidate}@lr{lr:g}-s0", norm="rmsnorm", group=group, candidate=candidate, lr=lr)
        chosen = RunResult(spec)
        selections[group] = Selection(group, chosen, (chosen,), edge=(edges or {}).get(group, ""))
    return StudyDesign(tuple(groups), selections=selections, matched_lrs=tuple(matched_lrs))


def synthetic(group: str, lr: float, seed_index: int, magnitude: list[float], loss: float) -> RunResult:
    spec = replace(
        BASE,
        label=f"{group}@lr{lr:g}-s{seed_index}",
        group=group,
        candidate=group,
        lr=lr,
        seed_index=seed_index,
        norm=group,
    )
    return fake_result(spec, loss, magnitude)


def synthetic_set() -> tuple[list[RunResult], StudyDesign]:
    """Two groups, 3 evaluation seeds, best rates 1e-3 (a) and 3e-3 (b), matched rates 3e-3 and 1e-2.
    Group a's last-layer magnitude is e^-1 of b's at 3e-3 and e^+0.5 at 1e-2 (seed offsets 0, 0.1, -0.1)."""
    results = []
    for i, offset in zip((1, 2, 3), (0.0, 0.1, -0.1), strict=True):
        b = 4.0 * math.exp(offset)
        results.append(synthetic("b", 3e-3, i, [1.0, 2.0, 3.0, b], 3.0 + offset))
        results.append(synthetic("b", 1e-2, i, [1.0, 2.0, 3.0, b], 3.2 + offset))
        results.append(synthetic("a", 3e-3, i, [1.0, 1.0, 1.0, b * math.exp(-1 + offset / 2)], 3.5))
        results.append(synthetic("a", 1e-2, i, [1.0, 1.0, 1.0, b * math.exp(0.5 + offset / 2)], 3.5))
        results.append(synthetic("a", 1e-3, i, [1.0, 1.0, 1.0, 1.0], 2.9 + offset + 0.01 * i))
    return results, kept_design({"a": 1e-3, "b": 3e-3}, (3e-3, 1e-2))


# ----------------------------------------------------------------------------- a synthetic pilot (the confirmation)
PILOT_ROLES = {"BHyT": "bhyt", "RMSNorm": "rmsnorm", "LayerNorm": "layernorm", "LNS": "lns", "Peri-LN": "peri_ln"}
PILOT_LR = 3e-3
PILOT_LN_MAGNITUDE = {
    # ln of the last-layer magnitude on seed indices 0 (selection), 1, 2, 3; layers 1-3 are 1, so every summary
    # follows: the median token is half of it, the variance its square, the growth ln(last / layer 1) its ln
    "rmsnorm": (2.0, 2.0, 2.0, 2.0),
    "layernorm": (1.8, 1.8, 1.8, 1.8),
    "peri_ln": (1.5, 1.5, 1.5, 1.5),
    "lns": (0.5, 0.2, 1.0, 0.1),
    "bhyt": (0.6, 0.6, 0.5, 0.7),
}
"""BHyT - RMSNorm in ln magnitude: -1.4, -1.5, -1.3 (clear); - LayerNorm: -1.2, -1.3, -1.1; - Peri-LN: -0.9, -1.0,
-0.8; - LNS: +0.4, -0.5, +0.6 (its 80 % interval crosses 0: infeasible)."""
PILOT_COMMAND = (
    "python -m bhyt_pl study --quick --layers 4 --steps 10 --seq-len 32 --batch-size 2 --val-batches 4 "
    "--shuffle-buffer 4 --no-compile --workers 1 --schemes rmsnorm layernorm lns peri_ln bhyt --lrs 3e-3 "
    "--matched-lrs 3e-3 --seeds 3 --out pilot"
)


def layer_run(spec: RunSpec, ln_magnitude: float, loss: float = 5.0) -> RunResult:
    """A finished run of 4 layers whose last-layer magnitude is ``exp(ln_magnitude)`` (the others 1)."""
    return fake_result(spec, loss, [1.0, 1.0, 1.0, math.exp(ln_magnitude)])


def pilot_spec(group: str, seed_index: int, steps: int = 10, label: str | None = None) -> RunSpec:
    """A pilot run's spec as ``python -m bhyt_pl study`` writes it (``--trajectory-every`` 5, seed 42 + index)."""
    from bhyt_pl.study.protocol.spec import run_label

    return replace(
        BASE,
        label=label or run_label(group, PILOT_LR, steps, seed_index),
        norm=group,
        group=group,
        candidate=group,
        lr=PILOT_LR,
        steps=steps,
        seed=42 + seed_index,
        data_seed=42 + seed_index,
        seed_index=seed_index,
        trajectory_every=5,
    )


def write_pilot(folder, ln_magnitude: Mapping[str, Sequence[float]] | None = None, **spec_fields):
    """A finished exploration's folder (``results.json`` only): the groups of ``ln_magnitude`` (default
    ``PILOT_LN_MAGNITUDE``) each kept at ``PILOT_LR``, the one matched rate, with 3 evaluation seeds; ``spec_fields``
    replace fields of every run's spec (a model small enough to train in a test)."""
    import json
    from pathlib import Path

    from bhyt_pl.study.protocol.design import parse_group
    from bhyt_pl.study.protocol.spec import TrainerSettings
    from bhyt_pl.study.record.results import StudyRecord
    from bhyt_pl.study.record.setup import RecordedSetup
    from bhyt_pl.study.run.data import StudyData

    ln_magnitude = ln_magnitude or PILOT_LN_MAGNITUDE
    steps = spec_fields.pop("steps", 10)
    runs = [
        layer_run(replace(pilot_spec(g, i, steps), **spec_fields), v[i])
        for g, v in ln_magnitude.items()
        for i in range(4)
    ]
    chosen = {g: [r for r in runs if r.spec.group == g and r.spec.seed_index == 0] for g in ln_magnitude}
    selections = {g: Selection(g, first[0], tuple(first)) for g, first in chosen.items()}
    design = StudyDesign(
        tuple(parse_group(g) for g in ln_magnitude), (PILOT_LR,), 3, 0, selections, (PILOT_LR,), "given"
    )
    meta = {
        "command": PILOT_COMMAND,
        "preset": "deep-32x128",
        "n_layers_label": "4",
        "steps": 10,
        "seq_len": 32,
        "batch_size": 2,
        "tokens_per_step": 64,
        "tokens_per_run": 640,
        "compile": False,
        "roles": {role: g for role, g in PILOT_ROLES.items() if g in ln_magnitude},
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # the setup PILOT_COMMAND resolves to, as the exploration records it
    setup = RecordedSetup(
        StudyData("embedded", "allenai/c4", "embedded", 32, 2, 0, 4), 4, TrainerSettings(compile=False), meta["roles"]
    )
    document = StudyRecord("exploration", meta, runs, setup, design).to_dict()
    (folder / "results.json").write_text(json.dumps(document, indent=1, default=str))
    return folder


# ----------------------------------------------------------------------------- the confirmation's runs
def confirmation_ln(group: str, i: int) -> float:
    """ln last-layer magnitude of the confirmation's seed ``i``: BHyT clearly below RMSNorm and LayerNorm, level with
    Peri-LN (its differences -0.14, +0.08, -0.10, +0.12, -0.06 on seeds 4-8: mean -0.02)."""
    return {
        "bhyt": 0.6 + 0.02 * (i - 6),
        "rmsnorm": 2.0 + 0.05 * (-1) ** i,
        "layernorm": 1.8 - 0.03 * (i - 6),
        "peri_ln": 0.6 + 0.1 * (-1) ** i,
        "lns": 0.5,
    }[group]


def confirmation_runs(plan, pilot) -> list:
    """The confirmation's runs of ``plan`` (``confirmation_specs``), each with ``confirmation_ln``'s magnitude."""
    from bhyt_pl.study.cli.confirmation_plan import confirmation_specs

    return [layer_run(spec, confirmation_ln(spec.group, spec.seed_index)) for spec in confirmation_specs(plan, pilot)]


def two_group_record():
    """An exploration's record: two groups of registered schemes, each kept at one rate, with two evaluation seeds."""
    from bhyt_pl.study.protocol.design import parse_group
    from bhyt_pl.study.record.results import StudyRecord

    runs, selections = [], {}
    for group, lr in (("rmsnorm", 1e-3), ("bhyt", 3e-3)):
        chosen = synthetic(group, lr, 0, [1.0, 2.0], 3.0)
        runs += [chosen, synthetic(group, lr, 1, [1.0, 2.0], 3.1), synthetic(group, lr, 2, [1.0, 3.0], 3.2)]
        selections[group] = Selection(group, chosen, (chosen,))
    groups = (parse_group("rmsnorm"), parse_group("bhyt"))
    design = StudyDesign(groups, (1e-3, 3e-3), 2, 1, selections, (3e-3,), "given with --matched-lrs")
    return StudyRecord(
        "exploration", {"command": "python -m bhyt_pl study", "schemes": ["rmsnorm", "bhyt"]}, runs, design=design
    )


def budget_run(spec, loss: float, median: tuple[float, float], saturation: tuple[float, float, float], batches):
    """A token-budget run whose last layer's median-token magnitude is ``median`` (step 0, end), with saturation at
    step 0, the early step (10) and the end (step 20), its validation loss ``loss`` (training loss 0.1 below) and
    per-batch validation losses ``batches``."""

    def point(step: int, m: float, s: float, val: float) -> dict:
        return {"step": step, "median_magnitude": [1.0, m], "magnitude": [1.0, 2 * m], "variance": [1.0, 1.0],
                "saturation": [s, s], "val_loss": val}  # fmt: skip

    trajectory = [point(0, median[0], saturation[0], 9.0), point(10, median[0], saturation[1], 8.0)]
    trajectory.append(point(20, median[1], saturation[2], loss))
    final = {"median_magnitude/layer_00": 1.0, "median_magnitude/layer_01": median[1],
             "magnitude/layer_00": 1.0, "magnitude/layer_01": 2 * median[1],
             "variance/layer_00": 1.0, "variance/layer_01": 1.0,
             "saturation/mlp_in/layer_00": saturation[2], "saturation/mlp_in/layer_01": saturation[2],
             "saturation/layer_00": saturation[2], "saturation/layer_01": saturation[2]}  # fmt: skip
    return RunResult(spec=spec, n_layers=2, dim=16, steps_done=20, val_loss=loss, train_loss=loss - 0.1,
                     depth_final=final, trajectory=trajectory, val_batch_losses=list(batches))  # fmt: skip


BUDGET_PLAN = {
    "rmsnorm": [(4.1, (2.0, 4.0), (0.0, 0.0, 0.0), (4.0, 4.0)), (4.1, (2.0, 4.0), (0.0, 0.0, 0.0), (4.0, 4.0))],
    "bhyt": [(4.0, (1.0, 2.0), (0.1, 0.5, 0.6), (4.0, 4.2)), (4.2, (1.0, 4.0), (0.1, 0.3, 0.2), (4.1, 4.1))],
}
"""Per group, each evaluation seed's (loss, median at step 0 and end, saturation at 0 / 10 / end, batch losses):
BHyT - RMSNorm is -0.1 and +0.1 in loss; its early saturation 0.5 and 0.3."""


def budget_record(ratios=(0.015,), select_through: int = 0, shift: tuple[float, ...] = (0.0,)):
    """A token-budget map's record: RMSNorm and BHyT on budgets of ``ratios`` (20 steps, 40, ...; early step 10),
    two evaluation seeds each from ``BUDGET_PLAN``, BHyT's losses on budget ``k`` moved by ``shift[k]``."""
    from bhyt_pl.study.protocol.design import parse_group
    from bhyt_pl.study.protocol.plan import evaluation_specs, selection_specs
    from bhyt_pl.study.protocol.token_budget import BudgetDesign, TokenBudget, budget_base
    from bhyt_pl.study.record.results import StudyRecord

    budgets = tuple(TokenBudget(r, 20 * (k + 1), 10) for k, r in enumerate(ratios))
    groups = (parse_group("rmsnorm"), parse_group("bhyt"))
    design = BudgetDesign(groups, "rmsnorm", budgets, {"rmsnorm": (3e-3,), "bhyt": (3e-3,)}, 2, 1, select_through)
    runs = []
    for k, budget in enumerate(budgets):
        base = budget_base(BASE, budget)
        for g in groups:
            if budget in design.selected_budgets:
                chosen = RunResult(selection_specs(g, (3e-3,), base)[0], val_loss=4.0)
                runs.append(chosen)
                design.selections.setdefault(budget.label, {})[g.label] = Selection(g.label, chosen, (chosen,))
            selection = design.selection(budget, g.label)
            for i, spec in enumerate(evaluation_specs(g, selection, (), 2, base)):
                loss, median, saturation, batches = BUDGET_PLAN[g.label][i]
                moved = shift[k] if g.label == "bhyt" else 0.0
                runs.append(budget_run(spec, loss + moved, median, saturation, batches))
    meta = {"command": "python -m bhyt_pl study token-budget", "validation": "4 fixed batches", "unigram_loss": 6.5}
    return StudyRecord("token_budget", meta, runs, budgets=design)

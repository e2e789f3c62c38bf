"""The confirmation's power plan (``bhyt_pl.study.protocol.power_plan``) against hand computations on
``power_reference``'s hand-worked pilot and the power by numerical integration (not scipy's noncentral t): the
family, the dropping rule, paper-level claims, the seeds per group, and ``plan.json`` frozen on a restart.
"""

from __future__ import annotations

import json
import math

import pytest
from power_reference import EFFECT, PILOT, SD, reference_power

from bhyt_pl import strict_json
from bhyt_pl.study.protocol import power, power_plan
from bhyt_pl.study.protocol.power_plan import Candidate, PaperClaim, Plan, make_plan

PILOT_SEEDS = (0, 1, 2, 3)  # selection seed 0, evaluation seeds 1..3


def _candidate(name: str, pilot=PILOT, target: str = "bhyt", baseline: str | None = None, **kw) -> Candidate:
    return Candidate(name, target, baseline or name, "median_magnitude", kw.pop("rule", "lower"), pilot, **kw)


def test_plan_seed_count_by_hand() -> None:
    # two tests of the hand pilot: a family of 2, each planned at 0.05 / 2 = 0.025
    plan = make_plan([_candidate("rmsnorm"), _candidate("peri_ln")], pilot_seed_indices=PILOT_SEEDS)
    row = plan.test("rmsnorm")
    assert plan.family_size == 2 and row.level == pytest.approx(0.025)
    assert (row.pilot_n, row.pilot_mean, row.pilot_sd) == (3, pytest.approx(-0.25), pytest.approx(0.05))
    assert row.effect == pytest.approx(EFFECT, abs=1e-6) and row.sd == pytest.approx(SD, abs=1e-6)
    # the independent power: 0.694 at 4 seeds, 0.864 at 5, so 5 is the smallest count with power >= 0.8
    assert reference_power(EFFECT, SD, 4, 0.025) < 0.8 <= reference_power(EFFECT, SD, 5, 0.025)
    assert row.seeds == 5 and row.status == "primary" and row.pairs == 5
    assert row.power == pytest.approx(reference_power(EFFECT, SD, 5, 0.025), abs=1e-6)
    # the plug-in count (the pilot's mean and SD taken as true): effect 0.25, SD 0.05 -> the minimum
    assert row.plug_in_seeds == power.MIN_SEEDS
    assert plan.group_seeds == {"bhyt": 5, "rmsnorm": 5, "peri_ln": 5} and plan.runs == 15
    # one test alone: level 0.05, power 0.660 at 3 seeds and 0.869 at 4
    alone = make_plan([_candidate("rmsnorm")], pilot_seed_indices=PILOT_SEEDS).test("rmsnorm")
    assert reference_power(EFFECT, SD, 3, 0.05) < 0.8 <= reference_power(EFFECT, SD, 4, 0.05)
    assert alone.level == 0.05 and alone.seeds == 4


def test_no_plan_goes_below_the_pilots_three_seeds() -> None:
    huge = make_plan([_candidate("dyt", pilot=(-5.0, -5.1, -4.9))], pilot_seed_indices=PILOT_SEEDS)
    assert power.power_at(2, huge.tests[0].effect, huge.tests[0].sd, 0.05) > 0.8  # 2 pairs would do
    assert huge.tests[0].seeds == power.MIN_SEEDS == 3


def test_an_infeasible_test_stays_out_of_the_family() -> None:
    # -0.5, 0.1, -0.2: mean -0.2, sd 0.3; 80 % interval -0.2 +- 1.885618 * 0.3 / sqrt(3) = [-0.5266, +0.1266]
    plan = make_plan(
        [_candidate("rmsnorm"), _candidate("lns", pilot=(-0.5, 0.1, -0.2))], pilot_seed_indices=PILOT_SEEDS
    )
    lns = plan.test("lns")
    assert lns.status == "infeasible" and lns.seeds is None and lns.pairs == 0
    assert lns.pilot_high == pytest.approx(0.126599, abs=1e-6) and lns.effect == pytest.approx(-0.126599, abs=1e-6)
    assert "80% interval [-0.527, +0.127] reaches 0" in lns.reason
    assert lns.plug_in_seeds is not None  # its mean and SD taken as true: a count for the exploratory row
    assert plan.family_size == 1 and plan.level == 0.05  # it does not count in Holm's family
    assert "lns" not in plan.group_seeds  # and trains nothing
    assert lns.level == pytest.approx(0.025)  # the level it would have if it joined


def test_dropping_recomputes_the_family_one_test_at_a_time() -> None:
    # strong: needs 3 at any level here; middle (the hand pilot): 6 seeds at 0.05/3, 5 at 0.05/2; weak: many.
    # With max_seeds 5, dropping every test over budget at m = 3 would lose "middle" too; one at a time keeps it.
    strong = _candidate("strong", pilot=(-1.0, -0.9, -0.95))
    middle = _candidate("middle")
    weak = _candidate("weak", pilot=(-0.5, -0.3, -0.4))
    assert make_plan([strong, middle, weak], pilot_seed_indices=PILOT_SEEDS, max_seeds=99).test("middle").seeds == 6
    plan = make_plan([strong, middle, weak], pilot_seed_indices=PILOT_SEEDS, max_seeds=5)
    assert [t.name for t in plan.primary] == ["strong", "middle"]
    assert plan.family_size == 2 and plan.level == pytest.approx(0.025) and plan.test("middle").seeds == 5
    dropped = plan.test("weak")
    assert dropped.status == "dropped" and dropped.level == pytest.approx(0.05 / 3)
    assert dropped.seeds > 5 and f"needs {dropped.seeds} seeds at alpha / 3 > max_seeds 5" == dropped.reason
    assert "weak" not in plan.group_seeds


def test_declared_exploratory_tests_are_planned_but_not_trained() -> None:
    dyt = _candidate("dyt", pilot=(-5.0, -5.1, -4.9), exploratory="DyT did not train at this budget")
    plan = make_plan([_candidate("rmsnorm"), dyt], pilot_seed_indices=PILOT_SEEDS)
    row = plan.test("dyt")
    assert row.status == "exploratory" and row.reason == "DyT did not train at this budget"
    assert row.seeds == 3 and row.level == pytest.approx(0.025)  # what it would need if it joined
    assert plan.family_size == 1 and set(plan.group_seeds) == {"bhyt", "rmsnorm"}


def test_paper_claim_plans_for_joint_power() -> None:
    # two components with the hand pilot, a family of 2 (level 0.025): 0.864^2 = 0.746 at 5 seeds, 0.946^2 at 6
    claim = PaperClaim("BHyT has the lowest median magnitude", ("rmsnorm", "layernorm"))
    plan = make_plan([_candidate("rmsnorm"), _candidate("layernorm")], [claim], pilot_seed_indices=PILOT_SEEDS)
    at = [reference_power(EFFECT, SD, n, 0.025) ** 2 for n in (5, 6)]
    assert at[0] < 0.8 <= at[1]
    (row,) = plan.claims
    assert row.status == "primary" and row.seeds == 6 and row.joint_power == pytest.approx(at[1], abs=1e-6)
    assert plan.test("rmsnorm").seeds == 5 and plan.test("rmsnorm").pairs == 6  # the claim raises its groups
    assert plan.group_seeds == {"bhyt": 6, "rmsnorm": 6, "layernorm": 6}


def test_paper_claim_with_an_infeasible_baseline_stays_exploratory() -> None:
    claim = PaperClaim("BHyT has the lowest median magnitude", ("rmsnorm", "lns", "dyt"))
    candidates = [
        _candidate("rmsnorm"),
        _candidate("lns", pilot=(-0.5, 0.1, -0.2)),
        _candidate("dyt", pilot=(-5.0, -5.1, -4.9), exploratory="DyT did not train"),
    ]
    (row,) = make_plan(candidates, [claim], pilot_seed_indices=PILOT_SEEDS).claims
    assert row.status == "exploratory" and row.seeds is None and math.isnan(row.joint_power)
    assert "lns is infeasible (the pilot's 80% interval [-0.527, +0.127] reaches 0)" in row.reason
    assert "dyt is exploratory (DyT did not train)" in row.reason and "rmsnorm" not in row.reason


def test_seeds_override_replaces_every_count() -> None:
    plan = make_plan([_candidate("rmsnorm"), _candidate("peri_ln")], pilot_seed_indices=PILOT_SEEDS, seeds_override=8)
    assert plan.group_seeds == {"bhyt": 8, "rmsnorm": 8, "peri_ln": 8} and plan.seeds_override == 8
    row = plan.test("rmsnorm")
    assert row.seeds == 5 and row.pairs == 8  # the plan's count stays visible beside the override
    assert row.power == pytest.approx(reference_power(EFFECT, SD, 8, 0.025), abs=1e-6)


def test_the_plans_seeds_never_overlap_the_pilots() -> None:
    plan = make_plan([_candidate("rmsnorm")], pilot_seed_indices=[0, 1, 2, 3, 2])
    assert plan.pilot_seed_indices == (0, 1, 2, 3) and plan.first_seed_index == 4
    for group in plan.group_seeds:
        indices = plan.seed_indices(group)
        assert len(indices) == plan.group_seeds[group] and not set(indices) & set(plan.pilot_seed_indices)
    with pytest.raises(ValueError, match="trains no confirmation run"):
        plan.seed_indices("lns")


def test_restart_keeps_plan_json(tmp_path) -> None:
    path = tmp_path / "confirmation" / "plan.json"
    first = power_plan.load_or_create(path, lambda: make_plan([_candidate("rmsnorm")], pilot_seed_indices=PILOT_SEEDS))
    written = path.read_text()
    assert json.loads(written)["group_seeds"] == {"bhyt": 4, "rmsnorm": 4}

    def other_inputs() -> Plan:  # a changed pilot would plan differently: it must not be used
        raise AssertionError("the plan was recomputed on a restart")

    again = power_plan.load_or_create(path, other_inputs)
    assert path.read_text() == written and json.loads(json.dumps(again.to_dict())) == json.loads(written)
    assert again.group_seeds == first.group_seeds and again.tests[0].seeds == 4
    assert isinstance(again.tests[0], power_plan.PlannedTest) and again.claims == ()
    changed = make_plan([_candidate("rmsnorm", pilot=(-0.5, -0.3, -0.4))], pilot_seed_indices=PILOT_SEEDS)
    assert changed.group_seeds != first.group_seeds  # the new inputs would have changed the plan
    assert power_plan.load_or_create(path, lambda: changed).group_seeds == first.group_seeds


def test_plan_round_trips_through_json(tmp_path) -> None:
    claim = PaperClaim("lowest", ("rmsnorm", "peri_ln"), why="Figure 3")
    plan = make_plan(
        [_candidate("rmsnorm"), _candidate("peri_ln"), _candidate("lns", pilot=(-0.5, 0.1, -0.2))],
        [claim],
        pilot_seed_indices=PILOT_SEEDS,
        source={"pilot": "docs/depth_study/results.json"},
    )
    loaded = Plan.load(plan.save(tmp_path / "plan.json"))
    assert json.dumps(loaded.to_dict(), sort_keys=True) == json.dumps(plan.to_dict(), sort_keys=True)
    # a test at the end (the default) writes no phase: plan.json stays as it was before tests had phases
    assert all("phase" not in t for t in plan.to_dict()["tests"]) and loaded.tests[0].phase == "end"
    made = make_plan([_candidate("rmsnorm", phase="training")], pilot_seed_indices=PILOT_SEEDS)
    assert Plan.load(made.save(tmp_path / "made.json")).tests[0].phase == "training"
    assert list(made.to_dict()["tests"][0])[-1] == "phase"
    assert loaded.claims[0].components == ("rmsnorm", "peri_ln") and loaded.source["pilot"].endswith("results.json")
    data = plan.to_dict() | {"version": 99}
    with pytest.raises(ValueError, match="plan.json has version 99; this bhyt_pl reads version 1"):
        Plan.from_dict(data)


def test_save_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "plan.json"
    make_plan([_candidate("rmsnorm")], pilot_seed_indices=PILOT_SEEDS).save(path)
    before = path.read_text()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(strict_json, "dumps", broken)  # fails with the temporary file open
    with pytest.raises(OSError, match="disk full"):
        make_plan([_candidate("peri_ln")], pilot_seed_indices=PILOT_SEEDS).save(path)
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_bad_inputs_are_reported_at_once() -> None:
    with pytest.raises(ValueError) as err:
        make_plan(
            [
                _candidate("a"),
                _candidate("a"),
                _candidate("b", rule="smaller"),
                _candidate("c", rule="no_worse"),
                _candidate("d", phase="later"),
            ],
            [PaperClaim("lowest", ("a", "zzz"))],
            pilot_seed_indices=PILOT_SEEDS,
            max_seeds=2,
            seeds_override=1,
            alpha=1.5,
        )
    message = str(err.value)
    for expected in (
        "invalid power plan",
        "candidate names must be unique, repeated: ['a']",
        "candidate 'b': rule must be one of ('lower', 'higher', 'no_worse', 'equivalent'), got 'smaller'",
        "candidate 'c': rule 'no_worse' needs a margin > 0, got 0.0",
        "candidate 'd': phase must be one of ('init', 'end', 'training'), got 'later'",
        "claim 'lowest': components must be candidate names, unknown: ['zzz']",
        "alpha must lie in (0, 1), got 1.5",
        "max_seeds must be >= min_seeds (3), got 2",
        "seeds_override (--seeds) must be >= 2",
    ):
        assert expected in message

"""The confirmation's plan as text (``bhyt_pl.study.protocol.power_plan_text``) on ``power_reference``'s hand-worked
pilot: every row with its pilot summary and assumptions worked by hand, the paper-level claims, and the runs."""

from __future__ import annotations

from power_reference import PILOT

from bhyt_pl.study.protocol import power_plan_text
from bhyt_pl.study.protocol.power_plan import Candidate, PaperClaim, make_plan

PILOT_SEEDS = (0, 1, 2, 3)  # selection seed 0, evaluation seeds 1..3


def _candidate(name: str, pilot=PILOT, **kw) -> Candidate:
    return Candidate(name, "bhyt", name, "median_magnitude", "lower", pilot, **kw)


def test_render_shows_every_row_and_the_runs() -> None:
    plan = make_plan(
        [_candidate("rmsnorm"), _candidate("lns", pilot=(-0.5, 0.1, -0.2))],
        [PaperClaim("lowest", ("rmsnorm", "lns"))],
        pilot_seed_indices=PILOT_SEEDS,
    )
    text = power_plan_text.render(plan)
    assert "| rmsnorm | median_magnitude | lower | 3 | -0.250 [-0.304, -0.196] | 0.050 | +0.196 | 0.106 |" in text
    assert "| lns |" in text and "infeasible" in text and "| lowest | rmsnorm; lns |" in text
    assert "bhyt 4, rmsnorm 4; 8 runs, seed indices 4..7 (the pilot used 0..3)" in text
    nothing = make_plan([_candidate("lns", pilot=(-0.5, 0.1, -0.2))], pilot_seed_indices=PILOT_SEEDS)
    assert nothing.family_size == 0 and nothing.runs == 0 and nothing.group_seeds == {}
    text = power_plan_text.render(nothing)
    assert "No test is in the family: the confirmation trains nothing (the pilot used 0..3)." in text


def test_render_says_when_seeds_override_the_plan() -> None:
    plan = make_plan([_candidate("rmsnorm"), _candidate("peri_ln")], pilot_seed_indices=PILOT_SEEDS, seeds_override=8)
    text = power_plan_text.render(plan)
    assert "Seeds per group (--seeds 8 overrides the plan's counts): bhyt 8, rmsnorm 8, peri_ln 8; 24 runs" in text


def test_render_names_a_phase_other_than_the_end() -> None:
    made = _candidate("rmsnorm, made by training", phase="training")
    text = power_plan_text.render(make_plan([made], pilot_seed_indices=PILOT_SEEDS))
    assert "| rmsnorm, made by training | median_magnitude | lower | 3 |" in text

"""The confirmation's pilot, candidates and plan (``bhyt_pl.study.cli.confirmation_plan``) on a synthetic pilot whose
per-seed differences are set by hand (``study_fixtures.PILOT_LN_MAGNITUDE``): the candidates read the pilot's
evaluation seeds only, the plan's seed count against an independent power computation, an infeasible test, run specs
on seeds above every pilot seed, the frozen plan a restart keeps, the record's round trip and a pilot refused."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from scipy import integrate
from scipy import stats as scipy_stats
from study_fixtures import PILOT_LN_MAGNITUDE, confirmation_runs, layer_run, pilot_spec, write_pilot

from bhyt_pl import strict_json
from bhyt_pl.study.cli import confirmation_plan as confirm
from bhyt_pl.study.cli.confirmation import CONFIRMATION
from bhyt_pl.study.cli.confirmation_plan import frozen_plan, load_pilot
from bhyt_pl.study.protocol import power_plan
from bhyt_pl.study.protocol.claims import ClaimSpec
from bhyt_pl.study.protocol.confirmation import evaluate
from bhyt_pl.study.record.results import StudyRecord

KIND = "confirmation"

MEDIAN = "BHyT < {}: median_magnitude"
T_90_2 = 1.8856180831641267  # t_{0.90, 2}: the half-width factor of an 80 % interval from 3 values


def reference_power(effect: float, sd: float, n: int, level: float) -> float:
    """Power of the one-sided paired t-test by one integral over the sample SD (not scipy's noncentral t): reject when
    Z + ncp > c sqrt(V / df), Z standard normal, V chi-square with df = n - 1, ncp = effect sqrt(n) / sd."""
    df = n - 1
    c = scipy_stats.t.ppf(1 - level, df)
    ncp = effect * math.sqrt(n) / sd
    value, _ = integrate.quad(
        lambda v: scipy_stats.norm.sf(c * math.sqrt(v / df) - ncp) * scipy_stats.chi2.pdf(v, df), 0, math.inf
    )
    return value


def test_candidates_read_the_pilots_evaluation_seeds_only(tmp_path: Path) -> None:
    folder = write_pilot(tmp_path / "pilot")
    document = json.loads((folder / "results.json").read_text())
    # a run on seed index 7 that no evaluation seed is (say, from an earlier stage): never a pilot difference, but
    # the confirmation's seeds must start above it
    document["runs"] += [layer_run(pilot_spec(g, 7), 9.0).to_dict() for g in ("bhyt", "rmsnorm", "lns")]
    (folder / "results.json").write_text(json.dumps(document))
    pilot = load_pilot(folder)
    found, claims, not_tested = confirm.candidates(pilot, 3e-3)
    by_name = {c.name: c for c in found}
    # BHyT - RMSNorm in ln median magnitude on seeds 1-3 (the selection seed 0 is not an evaluation seed either)
    assert by_name[MEDIAN.format("RMSNorm")].pilot == pytest.approx((-1.4, -1.5, -1.3))
    assert by_name[MEDIAN.format("LNS")].pilot == pytest.approx((0.4, -0.5, 0.6))
    assert by_name["BHyT < RMSNorm: variance"].pilot == pytest.approx((-2.8, -3.0, -2.6))  # the square: twice the ln
    assert by_name[MEDIAN.format("RMSNorm")].rate == 3e-3 and not by_name[MEDIAN.format("RMSNorm")].exploratory
    # declared reasons, and the theorem's condition read on the pilot's runs (these fakes record no bound)
    assert by_name["BHyT < RMSNorm: magnitude"].exploratory.startswith("the mean token: replaced by the median")
    assert by_name["BHyT < LNS: variance [theorem]"].exploratory == (
        "outside its condition on the pilot's runs (no variance-bound record)"
    )
    assert by_name["BHyT no worse than RMSNorm: val_loss"].rate is None  # the best arm: each at its best rate
    assert "BHyT < DyT: median_magnitude" in not_tested and "BHyT* < Peri-LN: variance_growth" in not_tested
    assert [c.name for c in claims] == [
        "BHyT's last-layer median-token magnitude is below RMSNorm's, LayerNorm's and Peri-LN's"
    ]
    assert pilot.seed_indices == (0, 1, 2, 3, 7)
    assert confirm.make_confirmation_plan(pilot, 3e-3).first_seed_index == 8


def test_the_plans_seed_count_matches_an_independent_power_computation(plan: power_plan.Plan) -> None:
    row = plan.test(MEDIAN.format("Peri-LN"))
    # by hand: pilot differences -0.9, -1.0, -0.8: mean -0.9, sd 0.1; the 80 % interval's bound nearer 0 is
    # -0.9 + t_{0.90,2} 0.1 / sqrt(3); the SD's one-sided 80 % bound is 0.1 sqrt(2 / chi2_{0.20,2}), and
    # chi2_{0.20,2} = -2 ln 0.8
    effect = 0.9 - T_90_2 * 0.1 / math.sqrt(3)
    sd = 0.1 / math.sqrt(-math.log(0.8))
    assert (row.effect, row.sd) == pytest.approx((effect, sd), abs=1e-9)
    assert plan.family_size == 12 and row.level == pytest.approx(0.05 / 12)
    needed = next(n for n in range(3, 50) if reference_power(effect, sd, n, 0.05 / 12) >= 0.8)
    assert row.seeds == needed == 5
    assert reference_power(effect, sd, 4, 0.05 / 12) < 0.8 <= reference_power(effect, sd, 5, 0.05 / 12)
    # every group of the family trains the largest count of its tests and claims; LNS is in no primary test
    assert plan.group_seeds == {"bhyt": 5, "rmsnorm": 5, "layernorm": 5, "peri_ln": 5}
    assert plan.source["candidates"] == {g: g for g in PILOT_LN_MAGNITUDE} and plan.source["rate"] == 3e-3


def test_an_infeasible_test_trains_nothing_and_says_why(plan: power_plan.Plan) -> None:
    row = plan.test(MEDIAN.format("LNS"))
    # by hand: +0.4, -0.5, +0.6: mean 1/6, sd sqrt(0.343333); 80 % interval 1/6 +- t_{0.90,2} sd / sqrt(3)
    sd = math.sqrt(((0.4 - 1 / 6) ** 2 + (-0.5 - 1 / 6) ** 2 + (0.6 - 1 / 6) ** 2) / 2)
    low, high = 1 / 6 - T_90_2 * sd / math.sqrt(3), 1 / 6 + T_90_2 * sd / math.sqrt(3)
    assert (row.pilot_low, row.pilot_high) == pytest.approx((low, high), abs=1e-9)
    assert row.status == power_plan.INFEASIBLE and row.seeds is None and row.pairs == 0
    assert row.reason == f"the pilot's 80% interval [{low:+.3f}, {high:+.3f}] reaches 0"
    assert "lns" not in plan.group_seeds


def test_runs_sit_on_new_seeds_above_every_pilot_seed_with_the_pilots_settings(pilot, plan: power_plan.Plan) -> None:
    specs = confirm.confirmation_specs(plan, pilot)
    assert len(specs) == plan.runs == 20
    assert {s.seed_index for s in specs} == set(range(4, 9)) and min(s.seed_index for s in specs) > max(
        pilot.seed_indices
    )
    assert [s.seed_index for s in specs] == sorted(s.seed_index for s in specs)  # whole pairs first
    template = pilot_spec("bhyt", 1)
    first = next(s for s in specs if s.group == "bhyt" and s.seed_index == 4)
    assert first == replace(template, label="bhyt@lr0.003-steps10-s4", seed_index=4, seed=46, data_seed=46)
    assert {s.group for s in specs} == set(plan.group_seeds) and all(not s.importance for s in specs)


def test_a_restart_keeps_plan_json_and_refuses_options_that_ask_for_another(tmp_path: Path, pilot) -> None:
    path = tmp_path / "confirmation" / confirm.PLAN_FILE
    first = frozen_plan(path, pilot, None, 12, None)
    written = path.read_bytes()

    def recompute(*args, **kwargs):
        raise AssertionError("a frozen plan was recomputed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(confirm, "make_confirmation_plan", recompute)
        again = frozen_plan(path, pilot, None, None, None)  # no option given: the plan's own
    assert (
        strict_json.loads(strict_json.dumps(again.to_dict()))
        == strict_json.loads(written)
        == strict_json.loads(strict_json.dumps(first.to_dict()))
    )
    assert path.read_bytes() == written
    with pytest.raises(ValueError, match=r"frozen .* --max-seeds 5: the plan has 12; --seeds 4: the plan has its own"):
        frozen_plan(path, pilot, None, 5, 4)
    with pytest.raises(ValueError, match="--rate is not|--rate 0.01 is not a matched rate"):
        frozen_plan(path, pilot, 1e-2, None, None)
    # the pilot changed under the plan: refused, naming both hashes
    document = json.loads((pilot.folder / "results.json").read_text())
    document["meta"]["note"] = "edited"
    (pilot.folder / "results.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="the pilot's results.json changed since the plan was made"):
        frozen_plan(path, load_pilot(pilot.folder), None, None, None)
    assert path.read_bytes() == written


def test_the_record_round_trips_and_the_pilot_refuses_other_records(
    tmp_path: Path, pilot, plan: power_plan.Plan
) -> None:
    record = StudyRecord(KIND, {"tokens_per_step": 64}, confirmation_runs(plan, pilot), plan=plan)
    document = json.loads(json.dumps(record.to_dict(CONFIRMATION.sections(record)), default=str))
    again = StudyRecord.from_dict(document)
    assert again.kind == KIND and document["schema_version"] == 2
    assert json.dumps(again.plan.to_dict()) == json.dumps(plan.to_dict())  # NaN powers: compared as text
    assert [r.spec for r in again.runs] == [r.spec for r in record.runs]
    assert json.loads(json.dumps(again.to_dict(CONFIRMATION.sections(again)), default=str)) == document
    family = {t["name"]: t for t in document["family"]}
    row = family[MEDIAN.format("RMSNorm")]
    assert row["runs"]["baseline"] == [f"rmsnorm@lr0.003-steps10-s{i}" for i in range(4, 9)]
    assert row["plan"]["seeds"] == 4 and row["plan"]["status"] == "primary" and row["verdict"] == "confirmed"
    assert row["p_one_sided"] < row["holm_p"] < 0.05 and row["geometric_mean_ratio_95"]["high"] < 1
    assert document["paper_claims"][0]["verdict"] == "not confirmed"
    exploratory = {t["name"]: t for t in document["exploratory"]}
    assert exploratory[MEDIAN.format("LNS")]["status"] == "infeasible"
    assert exploratory["BHyT < RMSNorm: magnitude"]["seeds_at_80_percent_power"] >= 3
    with pytest.raises(ValueError, match="is a confirmation's folder"):
        (tmp_path / "c").mkdir()
        (tmp_path / "c" / "results.json").write_text(json.dumps(document))
        load_pilot(tmp_path / "c")


def _start(run: dict, ln_magnitude: float) -> dict:
    """``run`` (a record's row) with its step-0 last-layer magnitude ``exp(ln_magnitude)`` (the others 1)."""
    start = dict(run["trajectory"][0], magnitude=[1.0, 1.0, 1.0, math.exp(ln_magnitude)])
    return run | {"trajectory": [start, *run["trajectory"][1:]]}


def test_a_family_declaring_the_made_by_training_phase_plans_and_decides_on_end_minus_start(tmp_path: Path) -> None:
    # the pilot: ln last-layer magnitude at the end (write_pilot) and at step 0, on seed indices 0..3
    end = {"bhyt": (0.6, 0.6, 0.5, 0.7), "rmsnorm": (2.0, 2.0, 2.0, 2.0)}
    start = {"bhyt": (0.0, 0.1, 0.2, 0.0), "rmsnorm": (0.0, 0.5, 0.4, 0.6)}
    folder = write_pilot(tmp_path / "pilot", end)
    document = json.loads((folder / "results.json").read_text())
    document["runs"] = [_start(r, start[r["spec"]["group"]][r["spec"]["seed_index"]]) for r in document["runs"]]
    (folder / "results.json").write_text(json.dumps(document))
    pilot = load_pilot(folder)
    row = ClaimSpec(
        "BHyT's training grows the last layer less than RMSNorm's", "Figure 3", "BHyT", "RMSNorm", "magnitude",
        "matched", "lower", primary=True, why="made by training", phase="training",
    )  # fmt: skip
    (found,), claims, _ = confirm.candidates(pilot, 3e-3, rows=(row,), paper=())
    # by hand on seeds 1-3: BHyT (0.6 - 0.1, 0.5 - 0.2, 0.7 - 0.0) - RMSNorm (2.0 - 0.5, 2.0 - 0.4, 2.0 - 0.6)
    assert found.name == "BHyT < RMSNorm: magnitude, made by training" and found.phase == "training"
    assert found.pilot == pytest.approx((-1.0, -1.3, -0.7))  # at the end it would be (-1.4, -1.5, -1.3)
    source = {"rate": 3e-3, "candidates": {"bhyt": "bhyt", "rmsnorm": "rmsnorm"}}
    plan = power_plan.make_plan([found], claims, pilot_seed_indices=pilot.seed_indices, source=source)
    (test,) = plan.primary
    assert test.phase == "training" and (test.pilot_n, test.pilot_mean) == (3, pytest.approx(-1.0))
    assert test.pilot_sd == pytest.approx(0.3)
    assert plan.to_dict()["tests"][0]["phase"] == "training"
    assert power_plan.Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).tests[0].phase == "training"
    # the confirmation's runs: end (0.6, 2.0) and step 0 (0.2, 0.5 + 0.1 (-1)^i) on every new seed i
    runs = []
    for spec in confirm.confirmation_specs(plan, pilot):
        i, bhyt = spec.seed_index, spec.group == "bhyt"
        run = layer_run(spec, 0.6 if bhyt else 2.0)
        first = dict(run.trajectory[0], magnitude=[1.0, 1.0, 1.0, math.exp(0.2 if bhyt else 0.5 + 0.1 * (-1) ** i)])
        runs.append(replace(run, trajectory=[first, *run.trajectory[1:]]))
    (result,) = evaluate(plan, runs).tests
    made = [(0.6 - 0.2) - (2.0 - 0.5 - 0.1 * (-1) ** i) for i in plan.seed_indices("bhyt")]  # -1.1 -+ 0.1
    assert result.difference.n == len(made) == plan.group_seeds["bhyt"]
    assert result.difference.mean == pytest.approx(sum(made) / len(made))  # at the end: exactly -1.4
    assert result.verdict == "confirmed" and result.to_dict()["phase"] == "training"
    assert result.to_dict()["plan"]["phase"] == "training"


def test_a_pilot_without_what_the_confirmation_needs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read its results.json"):
        load_pilot(tmp_path / "nowhere")
    folder = write_pilot(tmp_path / "pilot")
    document = json.loads((folder / "results.json").read_text())
    document["design"]["matched_lrs"] = []
    document["setup"] = None
    (folder / "results.json").write_text(json.dumps(document))
    with pytest.raises(ValueError) as err:
        load_pilot(folder)
    assert "it has no matched rate" in str(err.value) and "its record holds no setup" in str(err.value)

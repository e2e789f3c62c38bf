"""``python -m bhyt_pl study confirm`` (``bhyt_pl.study.cli.confirmation``) end to end on a synthetic pilot, its runs
trained by a stand-in for ``runner.run_one`` (no model: the study's scheduler and in-process launcher are real):
the plan is written and printed before the first run, exactly the planned runs train, on seeds above the pilot's,
the pilot's results.json is untouched, a restart reuses every run and keeps plan.json, ``--report-from`` rebuilds
the report, ``--plan-only`` writes nothing, and bad arguments fail before any work."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from study_fixtures import layer_run, write_pilot

from bhyt_pl.study import main
from bhyt_pl.study.cli import confirmation_plan as confirm
from bhyt_pl.study.cli.driver import report_from
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, run_dirname
from bhyt_pl.study.record.results import load as load_confirmation
from bhyt_pl.study.run import runner


def confirmation_ln(group: str, i: int) -> float:
    return {"bhyt": 0.6 + 0.02 * (i - 6), "rmsnorm": 2.0, "layernorm": 1.8 + 0.01 * i, "peri_ln": 1.5 - 0.01 * i}[group]


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Runs "trained" by a stand-in for ``runner.run_one`` that writes its ``result.json`` as the runner does (so a
    restart reuses it) and checks that the plan was frozen before it."""
    labels: list[str] = []

    def run_one(spec: RunSpec, datamodule_factory, val_batches, settings, out_dir: Path) -> RunResult:
        assert (out_dir / confirm.PLAN_FILE).is_file(), "a run started before plan.json was written"
        assert len(val_batches) == 4 and settings.compile is False  # the pilot's settings
        labels.append(spec.label)
        result = layer_run(spec, confirmation_ln(spec.group, spec.seed_index))
        folder = out_dir / "runs" / run_dirname(spec.label)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps(result.to_dict(), default=str))
        return result

    monkeypatch.setattr(runner, "run_one", run_one)
    return labels


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_confirm_trains_the_planned_runs_and_leaves_the_pilot_alone(
    tmp_path: Path, trained: list[str], capsys: pytest.CaptureFixture
) -> None:
    pilot = write_pilot(tmp_path / "pilot")
    before = _digest(pilot / "results.json")
    argv = ["confirm", "--pilot", str(pilot), "--max-seeds", "12", "--workers", "1"]
    assert main(argv) == 0
    out = pilot / "confirmation"
    printed = capsys.readouterr().out
    assert "Confirmation plan (frozen before any run)" in printed and f"frozen in {out / 'plan.json'}" in printed
    plan = load_confirmation(out).plan
    specs = confirm.confirmation_specs(plan, confirm.load_pilot(pilot))
    assert sorted(trained) == sorted(s.label for s in specs) and len(trained) == plan.runs == 20
    assert all(int(label.rsplit("-s", 1)[1]) >= 4 for label in trained)  # never a pilot seed (0-3)
    # the pilot's folder: its results.json as it was, and nothing new but the confirmation's own folder
    assert _digest(pilot / "results.json") == before
    assert sorted(p.name for p in pilot.iterdir()) == ["confirmation", "results.json"]
    document = json.loads((out / "results.json").read_text())
    assert document["kind"] == "confirmation" and document["meta"]["pilot_results_sha256"] == before
    for key in ("command", "wall_seconds", "loadavg_at_start", "loadavg_at_end", "machine", "runs_reused"):
        assert key in document["meta"], key
    assert [t["name"] for t in document["family"]] == [t.name for t in plan.primary]
    for row in document["family"]:
        labels = row["runs"]["target"] + row["runs"]["baseline"]
        assert len(labels) == 10 and all(label.endswith(tuple(f"-s{i}" for i in range(4, 9))) for label in labels)
        assert row["plan"]["status"] == "primary" and row["verdict"] in ("confirmed", "not confirmed")
        assert 0 <= row["p_one_sided"] <= row["holm_p"] <= 1
    (claim,) = document["paper_claims"]
    assert claim["verdict"] == "confirmed" and claim["p_intersection_union"] < 0.05
    assert {t["status"] for t in document["exploratory"]} >= {"infeasible", "exploratory"}
    text = (out / "report.md").read_text()
    for section in (
        "## The primary family",
        "## Paper-level claims",
        "## The frozen plan",
        "## Exploratory",
        "## Over training (uncorrected, descriptive)",
    ):
        assert section in text, section
    assert (out / "family_over_training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a restart: every run read back, plan.json and the verdicts as they were
    plan_bytes, report = (out / "plan.json").read_bytes(), text
    trained.clear()
    assert main(argv) == 0
    assert trained == [] and (out / "plan.json").read_bytes() == plan_bytes
    assert json.loads((out / "results.json").read_text())["meta"]["runs_reused"] == 20
    assert (out / "report.md").read_text().split("## The primary family")[1] == report.split("## The primary family")[1]
    # an option that asks for another plan: refused before any work
    assert main([*argv[:-4], "--max-seeds", "5"]) == 2
    assert "--max-seeds 5: the plan has 12" in capsys.readouterr().err and trained == []

    # --report-from rebuilds report.md from results.json alone, which it reads and does not write
    results, written = (out / "results.json").read_bytes(), (out / "report.md").read_text()
    (out / "report.md").unlink()
    report_from(out, figures=False)
    assert (out / "report.md").read_text() == written  # the document the run wrote, rebuilt from its record
    assert main(["confirm", "--report-from", str(out)]) == 0 and (out / "results.json").read_bytes() == results
    # one --report-from for every kind of study: the record says which kind renders it
    (out / "report.md").unlink()
    assert main(["--report-from", str(out)]) == 0 and (out / "report.md").read_text() == written


def test_an_interrupted_confirmation_says_so_and_its_resume_keeps_the_total_wall_time(
    tmp_path: Path, trained: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C at the 5th run: exit 130 with the resume line and no "finished" line, a report marked partial (4 of 20
    runs); the same command then finishes it, reusing the 4, and the record counts both invocations' time."""
    pilot = write_pilot(tmp_path / "pilot")
    out = pilot / "confirmation"
    stand_in = runner.run_one

    def interrupted(spec: RunSpec, *args, **kwargs) -> RunResult:
        if len(trained) == 4:
            raise KeyboardInterrupt
        return stand_in(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "run_one", interrupted)
    argv = ["confirm", "--pilot", str(pilot), "--max-seeds", "12", "--workers", "1"]
    with caplog.at_level("INFO"):
        assert main(argv) == 130
    messages = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("confirmation finished") for m in messages)
    assert (
        messages[-2].startswith("confirmation interrupted after ")
        and ", 4 of 20 runs done; partial report: " in messages[-2]
    )
    assert messages[-1] == "this machine's workers stop; the same command resumes it, reusing every finished run"
    report = (out / "report.md").read_text().splitlines()
    assert report[2].startswith("**Partial: 4 of 20 runs.** This confirmation was interrupted before its last run")
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["partial"]["state"] == "interrupted" and [i["outcome"] for i in meta["invocations"]] == ["interrupted"]

    monkeypatch.setattr(runner, "run_one", stand_in)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    assert len(trained) == 20  # the 4 finished runs were reused, not trained again
    assert any(r.getMessage().startswith("confirmation finished in ") for r in caplog.records)
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert "partial" not in meta and [i["outcome"] for i in meta["invocations"]] == ["interrupted", "finished"]
    total = sum(i["wall_seconds"] for i in meta["invocations"])
    assert meta["wall_seconds"] == pytest.approx(total, abs=0.11) and meta["runs_reused"] == 4
    text = (out / "report.md").read_text()
    assert "Partial" not in text and "- invocations: 2 (" in text
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_bytes((out / "results.json").read_bytes())
    assert main(["confirm", "--report-from", str(copy)]) == 0
    assert (copy / "report.md").read_text() == text  # a finished confirmation's report, from its record alone


def test_plan_only_prints_the_plan_and_writes_nothing(tmp_path: Path, trained: list[str], capsys) -> None:
    pilot = write_pilot(tmp_path / "pilot")
    assert main(["confirm", "--pilot", str(pilot), "--plan-only", "--out", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    assert "Seeds per group: bhyt 5, rmsnorm 5, layernorm 5, peri_ln 5; 20 runs, seed indices 4..8" in printed
    assert "(plan not written: --plan-only)" in printed
    assert not (tmp_path / "c").exists() and trained == []


def test_bad_arguments_fail_at_once_naming_each(tmp_path: Path, trained: list[str], capsys) -> None:
    pilot = write_pilot(tmp_path / "pilot")
    assert main(["confirm", "--max-seeds", "2", "--seeds", "1", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    for expected in (
        "--pilot DIR is required",
        "--max-seeds must be >= 3 (the pilot's own count), got 2",
        "--seeds must be >= 2 (a t-test needs 2 pairs), got 1",
        "--workers must be >= 1, got 0",
    ):
        assert expected in err
    assert main(["confirm", "--pilot", str(pilot), "--out", str(pilot)]) == 2
    assert "is the pilot's folder; the confirmation writes into its own" in capsys.readouterr().err
    assert main(["confirm", "--pilot", str(pilot), "--rate", "0.01"]) == 2
    assert "--rate 0.01 is not a matched rate of the pilot; its matched rates: 0.003" in capsys.readouterr().err
    # a schema-1 pilot (no resolved setup) whose command does not give the data it recorded: no setup to train with
    document = json.loads((pilot / "results.json").read_text())
    for key in ("schema_version", "kind", "setup"):
        del document[key]
    document["meta"]["seq_len"] = 64
    (pilot / "results.json").write_text(json.dumps(document))
    assert main(["confirm", "--pilot", str(pilot)]) == 2
    assert "its record holds no setup" in capsys.readouterr().err
    assert trained == [] and not (pilot / "confirmation").exists()


@pytest.mark.parametrize(("flag", "meant"), [("--pilto", "--pilot"), ("--max-seed", "--max-seeds")])
def test_a_mistyped_or_shortened_flag_is_one_line_naming_the_flag_meant(
    flag: str, meant: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["confirm", flag, "3"]) == 2
    hint = "(options: python -m bhyt_pl study confirm --help)"
    assert capsys.readouterr().err == f"error: unrecognized argument {flag}; did you mean {meant}? {hint}\n"


@pytest.mark.slow
def test_confirm_trains_real_runs_with_the_pilots_settings(tmp_path: Path) -> None:
    """The real runner: each confirmation run is a pilot run's spec on a new seed (a 2-layer model, 3 steps), trained
    with the pilot's data and validation batches; its statistics feed the verdicts (--seeds 2: 8 runs)."""
    pilot = write_pilot(tmp_path / "pilot", steps=3, overrides={"n_layers": 2}, trajectory_every=1)
    argv = ["confirm", "--pilot", str(pilot), "--seeds", "2", "--workers", "1", "--no-compile"]
    assert main(argv) == 0
    document = json.loads((pilot / "confirmation" / "results.json").read_text())
    runs = {r["spec"]["label"]: r for r in document["runs"]}
    assert sorted(runs) == sorted(
        f"{g}@lr0.003-steps3-s{i}" for g in ("bhyt", "rmsnorm", "layernorm", "peri_ln") for i in (4, 5)
    )
    r = runs["bhyt@lr0.003-steps3-s5"]
    assert r["status"] == "ok" and r["steps_done"] == 3 and r["n_layers"] == 2
    assert (r["spec"]["seed"], r["spec"]["data_seed"], r["spec"]["overrides"]) == (47, 47, {"n_layers": 2})
    assert [p["step"] for p in r["trajectory"]] == [0, 1, 2, 3] and len(r["trajectory"][-1]["median_magnitude"]) == 2
    for row in document["family"]:
        assert row["pairs"] == 2 and row["verdict"] in ("confirmed", "not confirmed")
        assert len(row["over_training"]) == 4


def test_the_confirmation_reads_config_files_and_dry_runs_on_the_shared_driver(
    tmp_path: Path, trained: list[str], capsys: pytest.CaptureFixture
) -> None:
    """--config and --dry-run belong to the driver, so the confirmation has them as the exploration does: a YAML
    file sets its options (flags override it) and the dry run prints the plan and its run count, writing nothing."""
    pilot = write_pilot(tmp_path / "pilot")
    config = tmp_path / "confirm.yaml"
    config.write_text("seeds: 2\nmax_seeds: 12\n")
    assert main(["confirm", "--pilot", str(pilot), "--config", str(config), "--dry-run"]) == 0
    expected = confirm.confirmation_specs(
        confirm.make_confirmation_plan(confirm.load_pilot(pilot), 3e-3, 12, 2), confirm.load_pilot(pilot)
    )
    out = capsys.readouterr().out
    assert f"runs: {len(expected)} on " in out and len(expected) == 2 * len({s.group for s in expected})
    assert trained == [] and not (pilot / "confirmation").exists()  # nothing trained, nothing written
    assert main(["confirm", "--pilot", str(pilot), "--config", str(config), "--seeds", "3", "--dry-run"]) == 0
    assert f"runs: {3 * len({s.group for s in expected})} on " in capsys.readouterr().out  # the flag wins
    config.write_text("sedes: 2\n")
    assert main(["confirm", "--pilot", str(pilot), "--config", str(config)]) == 2
    assert "sedes" in capsys.readouterr().err and trained == []

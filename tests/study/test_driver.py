"""The one driver (``bhyt_pl.study.cli.driver``): a kind of study defined in this file alone (its options, plan and
document, registered by a fixture that removes it again) runs through the ``local`` launcher, writes a record of its
own kind, and its document is rebuilt from that record by the same ``--report-from`` every kind shares."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from bhyt_pl.study import main
from bhyt_pl.study.cli.kinds import OnResult, PreparedStudy, StudyKind, register_kind, unregister_kind
from bhyt_pl.study.launch.execution import run_all
from bhyt_pl.study.launch.scheduler import Scheduler
from bhyt_pl.study.protocol.spec import RunResult, RunSpec, TrainerSettings
from bhyt_pl.study.record.results import StudyRecord
from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.run.data import StudyData


class TwoRates(StudyKind):
    """One scheme at two learning rates; its document lists each run's validation loss."""

    name = "two-rates"
    command = "two-rates"
    description = "rmsnorm at two rates, for the driver's test"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--steps", type=int, default=2)

    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        out = values["out"]
        assert isinstance(out, Path) and isinstance(values["steps"], int)
        specs = [
            RunSpec(
                label=f"rmsnorm@lr{lr:g}",
                norm="rmsnorm",
                preset="tiny",
                overrides={"n_layers": 1},
                lr=lr,
                steps=values["steps"],
            )
            for lr in (1e-3, 3e-3)
        ]
        data = StudyData("embedded", "allenai/c4", "embedded", 32, 2, 0, 4)
        setup = RecordedSetup(data, 1, TrainerSettings(compile=False))
        record = StudyRecord(self.name, {"command": " ".join(argv)}, [], setup)

        def execute(scheduler: Scheduler, on_result: OnResult) -> list[RunResult]:
            return run_all(specs, scheduler, on_result)

        return PreparedStudy(out=out, record=record, base_data_seed=42, execute=execute)

    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        path = out / "report.md"
        lines = [f"{r.spec.label}: {r.status}, val loss {r.val_loss:.6f}" for r in sorted(record.runs, key=str)]
        path.write_text("\n".join(["# Two rates", *lines]) + "\n")
        return {"report": path}


@pytest.fixture
def two_rates() -> Iterator[TwoRates]:
    kind = register_kind(TwoRates())
    yield kind
    unregister_kind(kind.name)


def test_a_kind_defined_here_runs_through_the_local_launcher_and_rebuilds_its_report(
    tmp_path: Path, two_rates: TwoRates
) -> None:
    out = tmp_path / "s"
    argv = ["two-rates", "--out", str(out), "--launcher", "local", "--timeout-min", "20", "--cpus-per-task", "1"]
    assert main([*argv, "--poll-interval-s", "0.5"]) == 0
    document = json.loads((out / "results.json").read_text())
    assert document["kind"] == "two-rates" and document["schema_version"] == 2
    assert document["setup"]["val_batches"] == 1 and document["setup"]["settings"]["compile"] is False
    runs = {r["spec"]["label"]: r for r in document["runs"]}
    assert sorted(runs) == ["rmsnorm@lr0.001", "rmsnorm@lr0.003"]
    assert all(r["status"] == "ok" and r["steps_done"] == 2 for r in runs.values())
    records = [json.loads(line) for line in (out / "jobs.jsonl").read_text().splitlines()]
    assert {r["label"] for r in records if r["event"] == "done"} == set(runs)  # each run was a local job
    written = (out / "report.md").read_text()
    assert written.count("val loss") == 2
    (out / "report.md").unlink()
    assert main(["--report-from", str(out)]) == 0  # the shared --report-from finds the kind in the record
    assert (out / "report.md").read_text() == written


def test_a_record_of_an_unregistered_kind_is_named(tmp_path: Path, two_rates: TwoRates) -> None:
    record = StudyRecord("two-rates", {}, [], None)
    (tmp_path / "results.json").write_text(json.dumps(record.to_dict()))
    unregister_kind("two-rates")
    assert main(["--report-from", str(tmp_path)]) == 2
    register_kind(two_rates)

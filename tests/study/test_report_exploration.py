"""The report document (``bhyt_pl.study.report.exploration``): the committed study's report rebuilt from its
``results.json`` alone, byte for byte, the sections a fresh record's report holds, the runs the depth figures read,
and that rendering writes nothing but the document and its figures."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

from study_fixtures import kept_design, synthetic_set, write_pilot

from bhyt_pl import strict_json
from bhyt_pl.study.cli.exploration import EXPLORATION
from bhyt_pl.study.protocol.claims import evaluate
from bhyt_pl.study.protocol.design import StudyRuns
from bhyt_pl.study.protocol.size import RunSize
from bhyt_pl.study.protocol.spec import RunResult, RunSpec
from bhyt_pl.study.record.invocation import Invocation
from bhyt_pl.study.record.results import StudyRecord, load, save
from bhyt_pl.study.report.exploration import depth_runs, depth_runs_words, write_report

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "depth_study"


def _rebuild(folder: Path) -> dict[str, Path]:
    """The report of ``folder/results.json`` alone, as ``--report-from`` rebuilds it (without figures)."""
    return write_report(folder, load(folder), figures=False)


def _save(folder: Path, record: StudyRecord) -> None:
    """``folder/results.json`` as the study saves it: the record with its claims evaluated (the exploration's
    sections), checked here against ``protocol.claims.evaluate`` called directly."""
    save(folder, record, EXPLORATION.sections(record))
    meta = record.meta
    items, skipped = evaluate(
        StudyRuns(record.runs), record.design, meta["roles"], tokens_per_step=int(meta["tokens_per_step"])
    )
    saved = json.loads((folder / "results.json").read_text())
    assert json.dumps(saved["claims"]) == json.dumps(json.loads(strict_json.dumps([c.to_dict() for c in items])))
    assert saved["claims_not_tested"] == [f"{c.statement}: {c.target} vs {c.baseline}" for c in skipped]


def with_size(record: StudyRecord, *sizes: RunSize) -> StudyRecord:
    """``record`` with ``meta["size"]`` after ``tokens_per_run``, as a study writes it now."""
    meta: dict[str, object] = {}
    for key, value in record.meta.items():
        meta[key] = value
        if key == "tokens_per_run":
            meta["size"] = [size.to_dict() for size in sizes]
    return dataclasses.replace(record, meta=meta)


def test_the_header_prints_the_size_a_record_holds_and_nothing_else_changes(tmp_path: Path) -> None:
    # the committed study's runs: deep-32x128, P = 32 x 196,608, embedding 8192 x 128, 180 x 8 x 64 tokens; the
    # totals add the norms' parameters (hand counts in tests/test_model_size.py)
    size = RunSize(32, 6_291_456, 1_048_576, {"rmsnorm": 7_348_352, "peri_ln": 7_356_544}, 92_160, 933_888)
    write_report(tmp_path, with_size(load(COMMITTED), size), figures=False)
    lines = (tmp_path / "report.md").read_text().splitlines()
    committed = (COMMITTED / "report.md").read_text().splitlines()
    at = committed.index("- tokens per run: 92160") + 1
    assert lines[at] == (
        "- parameters: 6,291,456 in block matrices (P), 7,348,352 to 7,356,544 in all (the schemes' norm parameters "
        "differ), 1,048,576 embedding; tokens per run 92,160 = 0.0146 tokens per parameter (T/P)"
    )
    assert lines[:at] + lines[at + 1 :] == committed
    # a sweep's record: one line per depth
    shallow = RunSize(2, 393_216, 1_048_576, {"rmsnorm": 1_442_432}, 10_240, None)
    write_report(tmp_path, with_size(load(COMMITTED), shallow, size), figures=False)
    text = (tmp_path / "report.md").read_text()
    assert "- parameters at 2 layers: 393,216 in block matrices (P), 1,442,432 in all, 1,048,576 embedding; " in text
    assert "- parameters at 32 layers: 6,291,456 in block matrices (P)" in text


def test_the_committed_report_rebuilds_from_its_record_byte_for_byte(tmp_path: Path) -> None:
    shutil.copy(COMMITTED / "results.json", tmp_path / "results.json")
    paths = _rebuild(tmp_path)
    assert paths == {"report": tmp_path / "report.md"}
    assert (tmp_path / "report.md").read_text() == (COMMITTED / "report.md").read_text()
    assert (tmp_path / "results.json").read_bytes() == (COMMITTED / "results.json").read_bytes()  # read, not written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]
    document = json.loads((COMMITTED / "results.json").read_text())
    design = load(COMMITTED).design.to_dict()  # the committed design predates its frame fields (read from meta)
    assert {k: v for k, v in design.items() if k in document["design"]} == document["design"]
    assert design["groups"] == document["meta"]["schemes"] and design["seeds"] == 3


META = {
    "command": "python -m bhyt_pl study --schemes a b",
    "mode": "study",
    "preset": "tiny",
    "n_layers_label": "4",
    "steps": 10,
    "tokens_per_step": 64,
    "tokens_per_run": 640,
    "extensions": 0,
    "roles": {"BHyT": "a", "RMSNorm": "b"},
    "unigram_loss": 3.5,
    "max_loss": 12.0,
    "machine": {"cpu": "test"},
}


def test_a_records_report_has_every_section_and_its_saved_record_holds_the_claims(tmp_path: Path) -> None:
    results, design = synthetic_set()
    record = StudyRecord("exploration", dict(META), results, design=design)
    paths = write_report(tmp_path, record, figures=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # rendering saves no record
    text = paths["report"].read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections == [
        "## Design",
        "## Claims",
        "## Claims over training",
        "## Depth-wise growth",
        "## Schemes at matched rates",
        "## Schemes at their best learning rate",
        "## Learning-rate sensitivity (selection seed, validation loss; bold: kept)",
        "## Layer importance (loss increase on the first validation batch when one block is replaced by the identity)",
        "## Approximated against exact statistics (site B)",
        "## Theorem condition lambda/kappa < 1/sqrt(L) (evaluation runs that record it)",
        "## Figures",
    ]
    assert "Roles of the claims: BHyT = a, RMSNorm = b." in text
    assert "- a: at lr 0.003 the last layer's magnitude is" in text  # the growth prose, per group
    # the depth claims at their three phases, under the claims; none declared a phase but the end
    subsections = [line for line in text.splitlines() if line.startswith("### ")]
    assert subsections == ["### At initialisation, at the end, made by training", "### Every test"]
    assert "No claim here declared a phase other than the end before these runs" in text
    _save(tmp_path, record)
    document = json.loads((tmp_path / "results.json").read_text())
    assert [c["groups"] for c in document["claims"]][:1] == [{"target": "a", "baseline": "b"}]
    assert document["claims_not_tested"] and len(document["runs"]) == len(results)
    assert not (tmp_path / "depth_final.png").exists()  # figures=False


def test_failed_runs_get_a_section_naming_each_with_its_error(tmp_path: Path) -> None:
    results, design = synthetic_set()
    failed = [
        dataclasses.replace(results[0], status="error", error="Traceback ...\nRuntimeError: CUDA | out of memory")
    ]
    failed.append(dataclasses.replace(results[1], status="error", error=None))
    rest = results[2:]
    text = write_report(tmp_path, StudyRecord("exploration", dict(META), failed + rest, design=design), figures=False)[
        "report"
    ].read_text()
    head = text.split("## Design")[0]
    assert f"## Failed runs (2 of {len(results)})" in head
    assert f"| `{results[0].spec.label}` | RuntimeError: CUDA \\| out of memory |" in head  # the last line, escaped
    assert f"| `{results[1].spec.label}` | no error recorded |" in head
    clean = write_report(
        tmp_path / "clean", StudyRecord("exploration", dict(META), results, design=design), figures=False
    )["report"]
    assert "## Failed runs" not in clean.read_text()


def _refuse(constant: str) -> float:
    raise ValueError(f"not strict JSON: {constant}")


def _pilot_record(tmp_path: Path) -> StudyRecord:
    """A depth study's record of registered schemes (its groups parse again when the record is read back)."""
    record = load(write_pilot(tmp_path / "pilot"))
    record.meta.update({"max_loss": 12.0, "machine": {"cpu": "test"}})
    return record


def test_a_record_with_nan_and_infinity_is_strict_json_and_rebuilds_its_report_byte_for_byte(tmp_path: Path) -> None:
    record = _pilot_record(tmp_path)
    record.runs[0] = dataclasses.replace(record.runs[0], status="diverged", val_loss=math.nan, diverged_loss=math.inf)
    paths = write_report(tmp_path, record, figures=False)
    _save(tmp_path, record)
    text = (tmp_path / "results.json").read_text()
    document = json.loads(text, parse_constant=_refuse)  # a strict reader: no bare NaN or Infinity
    assert document["runs"][0]["val_loss"] == "NaN" and document["runs"][0]["diverged_loss"] == "Infinity"
    back = load(tmp_path).runs[0]
    assert math.isnan(back.val_loss) and back.diverged_loss == math.inf
    written = paths["report"].read_text()
    paths["report"].unlink()
    _rebuild(tmp_path)
    assert paths["report"].read_text() == written and (tmp_path / "results.json").read_text() == text


def test_an_unfinished_study_is_marked_partial_at_the_top_and_lists_its_invocations(tmp_path: Path) -> None:
    record = _pilot_record(tmp_path)
    earlier = Invocation([{"started": "2025-01-02 10:00:00", "wall_seconds": 120.0, "outcome": "interrupted"}])
    earlier.record(record.meta, done=4, planned=12, final=False, outcome="interrupted")
    paths = write_report(tmp_path, record, figures=False)
    _save(tmp_path, record)
    lines = paths["report"].read_text().splitlines()
    assert lines[:2] == ["# Depth study", ""]
    assert lines[2].startswith("**Partial: 4 of at least 12 runs.** This study was interrupted before its last run")
    assert "The same command resumes it" in lines[2] and lines[4].startswith("Command: `python -m bhyt_pl study ")
    listed = [line for line in lines if line.startswith("- invocations: ")]
    assert listed[0].startswith("- invocations: 2 (2025-01-02 10:00:00, 120.0 s, interrupted; ")
    assert listed[0].endswith(" s, interrupted)") and record.meta["wall_seconds"] >= 120.0
    written = paths["report"].read_text()
    paths["report"].unlink()
    _rebuild(tmp_path)  # the marker comes from results.json alone
    assert paths["report"].read_text() == written
    earlier.record(record.meta, done=5, planned=20)  # between two runs: still running, nothing to resume yet
    head = write_report(tmp_path, record, figures=False)["report"].read_text().splitlines()[2]
    assert head.startswith("**Partial: 5 of 20 runs.** This study is still running: ") and "resumes" not in head
    earlier.record(record.meta, done=20, planned=20, outcome="finished")  # the same invocation, finished: no marker
    text = write_report(tmp_path, record, figures=False)["report"].read_text()
    _save(tmp_path, record)
    assert "Partial" not in text and " s, finished)" in text and "partial" not in load(tmp_path).meta


# last-layer magnitude per (group, lr) over evaluation seeds 1-3
MAGNITUDES = {("bhyt", 1e-2): [80.0, 90.0, 100.0], ("bhyt", 3e-3): [20.0, 22.0, 30.0]}


def _run(group: str, lr: float, seed: int, magnitude: float) -> RunResult:
    spec = RunSpec(label=f"{group}@lr{lr:g}-s{seed}", norm=group, group=group, candidate=group, lr=lr, seed_index=seed)
    return RunResult(spec, n_layers=2, dim=4, val_loss=3.0, depth_final={"magnitude/layer_01": magnitude})


def test_depth_figures_read_every_group_at_the_highest_matched_rate() -> None:
    results = StudyRuns(_run(g, lr, s, m[s - 1]) for (g, lr), m in MAGNITUDES.items() for s in (1, 2, 3))
    matched = kept_design({"bhyt": 1e-2}, matched_lrs=(1e-3, 3e-3))
    assert [(r.spec.lr, r.spec.seed_index) for r in depth_runs(results, matched, "bhyt")] == [
        (3e-3, s) for s in (1, 2, 3)
    ]
    assert depth_runs_words(matched) == "every scheme at lr 0.003 (matched)"
    unmatched = kept_design({"bhyt": 1e-2})
    assert [r.spec.lr for r in depth_runs(results, unmatched, "bhyt")] == [1e-2] * 3  # the best rate
    assert depth_runs_words(unmatched) == "each scheme at its best lr"
    assert depth_runs(results, matched, "bhyt_exact") == []  # no selection yet

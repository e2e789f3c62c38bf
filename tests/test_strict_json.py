"""The study's JSON files as strict JSON (``bhyt_pl.strict_json``): NaN and infinities written as strings that a
strict parser accepts, read back exactly, files written before (bare ``NaN``) still read, and a write whole or
absent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bhyt_pl import strict_json


def _refuse(constant: str) -> float:
    raise ValueError(f"not strict JSON: {constant}")


RECORD = {
    "meta": {"wall_seconds": 12.5, "command": "python -m bhyt_pl study", "none": None, "flag": True},
    "runs": [
        {"val_loss": math.nan, "diverged_loss": math.inf, "losses": [(1, 5.0), (2, -math.inf)], "label": "NaNa"},
    ],
}


def test_nan_and_infinity_are_strict_json_and_read_back_exactly(tmp_path: Path) -> None:
    text = strict_json.dumps(RECORD)
    document = json.loads(text, parse_constant=_refuse)  # what a strict reader sees: no bare NaN or Infinity
    run = document["runs"][0]
    assert (run["val_loss"], run["diverged_loss"], run["losses"][1][1]) == ("NaN", "Infinity", "-Infinity")
    assert math.isnan(float(run["val_loss"])) and float(run["diverged_loss"]) == math.inf  # as a float() reader
    back = strict_json.loads(text)
    again = back["runs"][0]
    assert math.isnan(again["val_loss"]) and again["diverged_loss"] == math.inf
    assert again["losses"] == [[1, 5.0], [2, -math.inf]] and again["label"] == "NaNa"  # other text is kept
    assert back["meta"] == RECORD["meta"]
    assert strict_json.dumps(back) == text  # a rebuild writes the same bytes
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        json.dumps(RECORD, allow_nan=False)  # why the encoding is needed


def test_a_file_written_before_with_bare_nan_still_reads() -> None:
    old = '{"val_loss": NaN, "diverged_loss": Infinity, "x": [-Infinity, 1.5]}'
    back = strict_json.loads(old)
    assert math.isnan(back["val_loss"]) and back["diverged_loss"] == math.inf and back["x"] == [-math.inf, 1.5]


def test_write_is_whole_or_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.json"
    strict_json.write(path, RECORD)
    before = path.read_bytes()
    assert before.decode() == strict_json.dumps(RECORD)

    def broken(data: object, indent: int | None = 1) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(strict_json, "dumps", broken)  # fails with the temporary file open
    with pytest.raises(OSError, match="disk full"):
        strict_json.write(path, {"other": 1})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["results.json"]

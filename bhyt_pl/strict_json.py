"""The study's JSON files (``results.json``, ``runs/<label>/result.json``, ``plan.json``) as strict JSON.

JSON has no NaN or infinity, and the study records both: NaN where a run measured nothing (a diverged run's
validation loss, a p-value without two pairs), infinity where a loss blew up. Python's ``json`` writes them as the
bare words ``NaN`` and ``Infinity``, which strict readers (JavaScript's ``JSON.parse``, ``jq``, most other
languages' parsers) refuse. Here they are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``:
the file is strict JSON, every value reads back exactly (``loads``; a report rebuilt from the file is the one
written with it), and a reader that calls ``float()`` on a number field gets the value back (Python's ``float``,
like JavaScript's ``Number``, parses these three strings). ``loads`` also reads the files written before, with
the bare words.

Only those three strings are read as numbers, wherever they stand: the study writes no text field that is
exactly one of them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["NON_FINITE", "dumps", "loads", "write"]

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a non-finite float is written (the string) and read back (the float)."""


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(item) for item in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {key: _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def dumps(data: Any, indent: int | None = 1) -> str:
    """``data`` as strict JSON: non-finite floats as their strings (module docstring), any other object that is
    not JSON as its ``str``."""
    # json calls ``default`` for unknown objects only, never for floats: the non-finite ones are replaced first
    return json.dumps(_encode(data), indent=indent, default=str, allow_nan=False)


def loads(text: str | bytes) -> Any:
    """A document ``dumps`` wrote (or an older one with bare ``NaN``/``Infinity``), non-finite floats restored."""
    return _decode(json.loads(text))


def write(path: Path, data: Any, indent: int | None = 1) -> Path:
    """Writes ``dumps(data)`` to ``path`` whole or not at all: a temporary file beside it (this process's own name,
    so the file gets the folder's usual permissions), flushed to disk, then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(dumps(data, indent=indent))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path

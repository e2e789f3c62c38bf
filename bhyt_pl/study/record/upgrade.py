"""Records written before ``results.json`` was versioned, read as today's (``bhyt_pl.study.record.results``).

A schema-1 record has no ``schema_version``, no ``kind`` and no resolved ``setup``: an exploration's was told from
a confirmation's by its ``plan`` key (and ``meta["kind"]``), and a later stage rebuilt its setup by parsing its
recorded command with the live command line. The converter gives it a kind, fills its design's frame from
``meta`` where the design was written without one, and rebuilds an exploration's setup once, with the parser
pinned for schema 1 (``bhyt_pl.study.record.v1_command``), saying so in the log and in ``setup["source"]``. The
file itself is never rewritten.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bhyt_pl.study.record.setup import RecordedSetup
from bhyt_pl.study.record.v1_command import parse_v1_command

__all__ = ["SCHEMA_VERSION", "V1_SETUP_SOURCE", "upgrade"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Version 1: the records written before ``kind``, ``schema_version`` and ``setup``."""

V1_SETUP_SOURCE = "rebuilt from the recorded command by the pinned schema-1 parser"

# a design written without its frame (the schema-1 docs/depth_study/results.json): ``meta`` holds these fields
_FRAME_FROM_META = {"groups": "schemes", "lrs": "lrs", "seeds": "seeds", "extensions": "extensions"}


def _v1_setup(meta: Mapping[str, Any]) -> dict[str, object] | None:
    """An exploration's setup from its recorded command, checked against the shapes its ``meta`` recorded; None
    (with a warning) when the command cannot say."""
    try:
        data, val_batches, settings = parse_v1_command(str(meta.get("command", "")))
    except ValueError as exc:
        log.warning("a schema-1 record's setup cannot be rebuilt: %s", exc)
        return None
    differs = [
        f"{key} {getattr(data, key)} where its meta recorded {meta[key]}"
        for key in ("seq_len", "batch_size")
        if key in meta and getattr(data, key) != meta[key]
    ]
    if differs:
        log.warning("a schema-1 record's command does not give its recorded data: %s", "; ".join(differs))
        return None
    if "compile" in meta:  # what the runs really did, as the record says
        settings = type(settings)(**{**settings.__dict__, "compile": bool(meta["compile"])})
    roles = {str(k): str(v) for k, v in (meta.get("roles") or {}).items()}
    log.info("results.json has schema 1: its setup is %s (%s)", V1_SETUP_SOURCE, meta.get("command"))
    return RecordedSetup(data, val_batches, settings, roles, V1_SETUP_SOURCE).to_dict()


def upgrade(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` at ``SCHEMA_VERSION`` (itself when it already is)."""
    version = data.get("schema_version", 1)
    if version == SCHEMA_VERSION:
        return data
    if version != 1:
        raise ValueError(f"schema_version {version!r} is newer than this version reads ({SCHEMA_VERSION})")
    missing = [key for key in ("meta", "runs") if key not in data]
    if missing:
        raise ValueError(f"results.json has no {missing}: not a study's record (keys: {sorted(data)})")
    meta = dict(data["meta"])
    confirmation = "plan" in data or meta.get("kind") == "confirmation"
    upgraded: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "confirmation" if confirmation else "exploration",
        "setup": None if confirmation else _v1_setup(meta),
        "meta": meta,
    }
    if "design" in data:
        design = dict(data["design"])
        for name, meta_key in _FRAME_FROM_META.items():
            if name not in design and meta_key in meta:
                design[name] = meta[meta_key]
        upgraded["design"] = design
    if "plan" in data:
        upgraded["plan"] = data["plan"]
    upgraded["runs"] = data["runs"]
    return upgraded

"""Data-test fixtures: offline Hugging Face libraries with a private cache, small C4-format shards."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import huggingface_hub
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def offline_hf(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The environment variables, and the module constants ``datasets`` and ``huggingface_hub`` read
    from them at import (which happened before any fixture ran)."""
    home = tmp_path_factory.getbasetemp() / "hf_home"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def write_shard(path: Path, lines: list[str]) -> Path:
    """A C4-format shard: gzip JSON lines (``lines`` are written verbatim, malformed ones too)."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


def c4_row(text) -> str:
    return json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.org/"})


def word_docs(shard: int, n: int) -> list[str]:
    """Documents whose words are unique across the fixture (``s{shard}d{doc}w{word}``)."""
    return [" ".join(f"s{shard}d{d}w{w}" for w in range(5 + d % 7)) for d in range(n)]


@pytest.fixture
def c4_dir(tmp_path: Path) -> Path:
    """A C4 mirror: four train shards of 12 documents, one validation shard."""
    root = tmp_path / "c4" / "en"
    root.mkdir(parents=True)
    for i in range(4):
        write_shard(root / f"c4-train.{i:05d}-of-00004.json.gz", [c4_row(t) for t in word_docs(i, 12)])
    write_shard(root / "c4-validation.00000-of-00001.json.gz", [c4_row(t) for t in word_docs(9, 6)])
    return tmp_path / "c4"

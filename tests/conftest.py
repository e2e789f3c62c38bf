"""Shared test set-up: offline Hugging Face, a private HF cache, deterministic seeds."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _offline_and_seeded(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)

"""``bhyt_pl.bench.gpu``: the GPU command is the bench command with the paper model's settings."""

from __future__ import annotations

import json

import pytest

from bhyt_pl.bench import gpu


def _dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert gpu.main(["--dry-run", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_settings_are_the_paper_models(capsys: pytest.CaptureFixture[str]) -> None:
    s = _dry_run(capsys)
    assert (s["device"], s["dtype"], s["preset"], s["compile"]) == ("cuda", "bfloat16", "llama-374m", True)
    assert s["schemes"] == ["rmsnorm", "rmsnorm:impl=reference", "bhyt", "bhyt:impl=reference", "bhyt_exact"] + [
        "dyt",
        "peri_ln",
    ]
    assert (s["seq_len"], s["batch"], s["site_dims"], s["site_tokens"]) == (1024, 8, [1024, 2048], 32768)
    assert s["parts"] == ["sites", "train", "generate", "memory"]


def test_arguments_given_after_override_the_gpu_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    s = _dry_run(capsys, "--preset", "tiny", "--repeats", "2")
    assert s["preset"] == "tiny" and s["repeats"] == 2 and s["dtype"] == "bfloat16"


def test_gpu_script_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu.main(["--dry-run"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["device"] == "cuda" and settings["dtype"] == "bfloat16" and settings["preset"] == "llama-374m"
    assert settings["compile"] is True

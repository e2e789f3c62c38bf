"""The study's protocol loads no training or plotting stack: importing ``bhyt_pl.study`` (lazy), its shared types
(``protocol.spec``), its statistics or its power plan leaves Lightning, submitit and matplotlib unloaded, so a
report, a plan or a test of the statistics starts in a fraction of the time and runs where they are not installed.

Each import runs in a fresh interpreter: this process has loaded Lightning already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from distributed_jobs.launch import ROOT, clean_env

HEAVY = ("lightning", "pytorch_lightning", "submitit", "matplotlib")


def loaded_after(module: str) -> list[str]:
    """The top-level names of ``HEAVY`` in a fresh interpreter's ``sys.modules`` once ``module`` is imported."""
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "bhyt_pl.study",
        "bhyt_pl.study.protocol.spec",
        "bhyt_pl.study.protocol.stats",
        "bhyt_pl.study.protocol.power_plan",
    ],
)
def test_the_protocol_loads_no_training_or_plotting_stack(module: str) -> None:
    assert loaded_after(module) == []


def test_the_probe_sees_a_heavy_import() -> None:
    # the check itself can fail: a module that loads Lightning is reported
    assert "lightning" in loaded_after("bhyt_pl.study.run.callbacks")

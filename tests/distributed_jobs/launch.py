"""Run ``python -m bhyt_pl fit`` (or any module) as a subprocess with a clean distributed environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

_DIST_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
)


def clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _DIST_VARS and not k.startswith(("TORCHELASTIC_", "PL_", "SLURM_", "PYTEST_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def run(argv: list[str], timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"job failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def write_yaml(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def records(out_dir: Path, kind: str = "rank") -> dict[int, list[dict]]:
    """rank -> the step records of that rank (``StepRecorder``), in order; ``kind="val"``: its validation records."""
    result = {}
    for f in sorted(out_dir.glob(f"{kind}*.jsonl")):
        result[int(f.stem[len(kind) :])] = [json.loads(line) for line in f.read_text().splitlines()]
    return result

"""Every ```python block of README.md runs, so the documentation cannot drift from the code.

Each block runs as its own script in a fresh interpreter, in one working folder shared by the blocks, with one
documented change: every ``max_steps=N`` becomes ``max_steps=2`` (``SHORTEN``), so training examples take seconds.
The folder first gets what the README's examples read: ``runs/tiny-bhyt/version_0/checkpoints/last.ckpt``, the
checkpoint of the README's ``fit --config recipes/tiny.yaml --model.norm bhyt`` (shortened the same way).
A block added to the README later is run by this test without an edit here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bhyt_pl.cli import main

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SHORTEN = (re.compile(r"\bmax_steps=\d+"), "max_steps=2")
"""The one change made to a block before it runs: training examples stop after two optimizer steps."""


def readme_blocks() -> list[tuple[int, str]]:
    """``(line number, source)`` of every ```python block of README.md."""
    text = (ROOT / "README.md").read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def shortened(source: str) -> str:
    pattern, replacement = SHORTEN
    return pattern.sub(replacement, source)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the blocks run in, holding the checkpoint the README's examples load."""
    folder = tmp_path_factory.mktemp("readme")
    args = ["fit", "--config", str(ROOT / "recipes" / "tiny.yaml"), "--model.norm", "bhyt", "--runs_dir",
            str(folder / "runs"), "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
    main(args)
    assert (folder / "runs" / "tiny-bhyt" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    return folder


def test_the_readme_has_python_blocks_and_the_shortening_reaches_every_training_example() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 5, "README.md lost its Python examples"
    assert shortened("L.Trainer(max_steps=30, x=1)") == "L.Trainer(max_steps=2, x=1)"
    trainers = [source for _, source in blocks if "Trainer(" in source]
    assert trainers and all("max_steps=" in source for source in trainers), "a Trainer the test cannot shorten"


@pytest.mark.slow
@pytest.mark.parametrize(("line", "source"), [pytest.param(*block, id=f"line{block[0]}") for block in readme_blocks()])
def test_readme_python_block_runs(line: int, source: str, workdir: Path) -> None:
    script = workdir / f"readme_line{line}.py"
    script.write_text(shortened(source))
    env = {**os.environ, "MPLBACKEND": "Agg"}  # offline Hugging Face, as the suite (conftest.py)
    proc = subprocess.run(
        [sys.executable, script.name], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"

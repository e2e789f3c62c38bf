"""Every ```python block of README.md and docs/**/*.md runs, so the documentation cannot drift from the code.

Each block runs as its own script in a fresh interpreter, in one working folder shared by the blocks, with two
documented changes (``SHORTEN``): every ``max_steps=N`` becomes ``max_steps=2``, so training examples take seconds,
and every ``repeats=N`` becomes ``repeats=1``, so timing examples time once.
The folder first gets what the examples read: ``runs/tiny-bhyt/version_0/checkpoints/last.ckpt``, the
checkpoint of the documented ``fit --config recipes/tiny.yaml --model.norm bhyt`` (shortened the same way).
A block added to the documents later is run by this test without an edit here; their shell commands are run or
parsed by tests/test_documented_commands.py, and tests/test_doc_blocks.py accounts for every block of every kind.
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
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SHORTEN = ((re.compile(r"\bmax_steps=\d+"), "max_steps=2"), (re.compile(r"\brepeats=\d+"), "repeats=1"))
"""The changes made to a block before it runs: training examples stop after two optimizer steps, timing examples
time each candidate once."""


def readme_blocks() -> list[tuple[int, str]]:
    """``(line number, source)`` of every ```python block of README.md."""
    return [(line, source) for path, line, source in python_blocks() if path == "README.md"]


def python_blocks() -> list[tuple[str, int, str]]:
    """``(document, line number, source)`` of every ```python block of README.md and docs/**/*.md."""
    blocks = []
    for path in DOCUMENTS:
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        blocks += [(name, text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]
    return blocks


def shortened(source: str) -> str:
    for pattern, replacement in SHORTEN:
        source = pattern.sub(replacement, source)
    return source


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


def test_the_documents_have_python_blocks_and_the_shortening_reaches_every_training_example() -> None:
    assert readme_blocks(), "README.md lost its example of the components in a script of one's own"
    assert len(python_blocks()) >= 5, "README.md and docs/ lost their Python examples"
    assert shortened("L.Trainer(max_steps=30, x=1)") == "L.Trainer(max_steps=2, x=1)"
    assert shortened("interleaved(fns, repeats=9, warmup=1)") == "interleaved(fns, repeats=1, warmup=1)"
    assert any(path.startswith("docs/") for path, _, _ in python_blocks()), "docs/ lost its Python examples"
    trainers = [source for _, _, source in python_blocks() if "Trainer(" in source]
    assert trainers and all("max_steps=" in source for source in trainers), "a Trainer the test cannot shorten"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "line", "source"),
    [pytest.param(*block, id=f"line{block[1]}" if block[0] == "README.md" else f"{block[0]}:{block[1]}")
     for block in python_blocks()],
)  # fmt: skip
def test_readme_python_block_runs(path: str, line: int, source: str, workdir: Path) -> None:
    script = workdir / f"{Path(path).stem}_line{line}.py"
    script.write_text(shortened(source))
    env = {**os.environ, "MPLBACKEND": "Agg"}  # offline Hugging Face, as the suite (conftest.py)
    proc = subprocess.run(
        [sys.executable, script.name], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"{path} line {line}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"

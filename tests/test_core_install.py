"""``pip install bhyt_pl`` without extras: the model, the data, the callbacks and ``python -m bhyt_pl fit`` work, and
the optional parts (the study, the evaluation) say in one line which ``pip install`` adds them.

The check runs in a fresh interpreter that sees only what a core install brings: started without ``site`` (``-S``),
it adds views of the installation's site-packages folders that leave out every distribution outside the closure of
``[project] dependencies`` (lm-eval, scipy, submitit, and the test suite's own transformers, pytest, ...), their
metadata included, as libraries that probe for a package by its metadata (torchmetrics asks for scipy) would find
it otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from distributed_jobs.launch import ROOT, clean_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bhyt_pl.optional import EXTRAS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

OPTIONAL_MODULES = sorted(module for extra in EXTRAS.values() for module in extra.modules)


def core_requirements() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def dependency_closure(requirements: list[str]) -> set[str]:
    """The canonical names of the installed distributions that ``requirements`` pull in, extras and markers
    evaluated as pip would here."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.distribution(requirement.name).requires or []
        except importlib.metadata.PackageNotFoundError:  # not for this platform (a marker pip skipped)
            continue
        for text in requires:
            needed = Requirement(text)
            extras = ("", *requirement.extras)  # a plain requirement, or one of the extras asked for
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(needed)
    return {name for name, _ in seen}


def core_site_folders(into: Path) -> list[Path]:
    """One folder per site-packages folder of this interpreter, with links to what a core install has there: the
    entries that a distribution of the core's closure (or bhyt_pl itself) owns, and those no distribution owns."""
    keep = dependency_closure(core_requirements()) | {"bhyt-pl"}
    owners: dict[Path, set[str]] = {}  # a top-level entry of a site folder -> the distributions whose files it holds
    for dist in importlib.metadata.distributions():
        base, name = Path(dist.locate_file("")).resolve(), canonicalize_name(dist.metadata["Name"])
        for top in {Path(file).parts[0] for file in dist.files or ()} - {".."}:
            owners.setdefault(base / top, set()).add(name)
    folders = []
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []  # a virtual environment has none
    sources = dict.fromkeys(Path(p).resolve() for p in [*site.getsitepackages(), *user])
    for i, source in enumerate(s for s in sources if s.is_dir()):
        folder = into / f"site-{i}"
        folder.mkdir()
        for entry in source.iterdir():
            if owners.get(entry.resolve(), keep) & keep:
                (folder / entry.name).symlink_to(entry)
        folders.append(folder)
    return folders


@pytest.fixture(scope="module")
def core_site(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.pathsep.join(str(folder) for folder in core_site_folders(tmp_path_factory.mktemp("core-site")))


def run_core_only(core_site: str, *args: str) -> subprocess.CompletedProcess:
    """``python -S -c PRELUDE+code`` or ``-m module``: the core install's site folders, this checkout first."""
    prelude = f"import site\nfor folder in {core_site.split(os.pathsep)!r}:\n    site.addsitedir(folder)\n"
    if args[0] == "-m":  # run the module after the prelude, as ``python -m`` would
        run_module = f"runpy.run_module({args[1]!r}, run_name='__main__', alter_sys=True)"
        code = prelude + f"import runpy, sys\nsys.argv[1:] = {list(args[2:])!r}\n{run_module}\n"
    else:
        code = prelude + args[0]
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


CORE_CHECKS = """
import importlib.util, inspect, json, sys
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback

import bhyt_pl
import bhyt_pl.callbacks as callbacks
from bhyt_pl import LlamaLM
from bhyt_pl.cli import main
from bhyt_pl.data import C4DataModule

data = C4DataModule(data_files="embedded", tokenizer="embedded", seq_len=16, batch_size=2)
data.setup("fit")
batch = next(iter(data.train_dataloader()))
lm = LlamaLM(preset="tiny", overrides={"n_layers": 1}, seq_len=16, tokenizer="embedded")
lm.configure_model()  # as the Trainer does
loss, tokens = lm.compute_loss(batch)
logits = lm(batch["input_ids"])
reference = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)
made = [name for name in callbacks.__all__ if inspect.isclass(getattr(callbacks, name))
        and issubclass(getattr(callbacks, name), Callback) and getattr(callbacks, name)() is not None]
main(["fit", "--config", "recipes/tiny.yaml", "--runs_dir", RUNS_DIR, "--trainer.max_steps", "1",
      "--data.init_args.seq_len", "16", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false"])
print(json.dumps({
    "package": bhyt_pl.__file__,
    "optional_found": [m for m in OPTIONAL if importlib.util.find_spec(m) is not None],
    "optional_loaded": sorted({m.split(".")[0] for m in sys.modules} & set(OPTIONAL)),
    "loss": loss.item(), "reference": reference.item(), "tokens": int(tokens),
    "supervised": int((batch["labels"] != -100).sum()), "callbacks": made,
}))
"""


def test_the_core_install_trains_without_the_extras(core_site: str, tmp_path: Path) -> None:
    import inspect

    from lightning.pytorch import Callback

    import bhyt_pl.callbacks as callbacks

    proc = run_core_only(core_site, f"OPTIONAL = {OPTIONAL_MODULES!r}\nRUNS_DIR = {str(tmp_path)!r}\n" + CORE_CHECKS)
    assert proc.returncode == 0, proc.stderr[-6000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).resolve() == ROOT / "bhyt_pl" / "__init__.py"
    assert found["optional_found"] == [] and found["optional_loaded"] == []
    # the loss from the final hidden states (the model's chunked cross-entropy) is the one of its logits
    assert found["tokens"] == found["supervised"] > 0 and found["loss"] == pytest.approx(found["reference"], rel=1e-5)
    classes = [n for n in callbacks.__all__ if inspect.isclass(c := getattr(callbacks, n)) and issubclass(c, Callback)]
    assert found["callbacks"] == classes and "DepthStatsMonitor" in classes  # each one built with its defaults
    assert list(tmp_path.glob("tiny-rmsnorm/version_0/checkpoints/last.ckpt"))  # the fit ran its step and saved


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        (["study", "--dry-run"], 'the study needs scipy and submitit: {python} -m pip install -e ".[study]"'),
        (["eval", "--ckpt_path", "x.ckpt"], 'the evaluation needs lm_eval: {python} -m pip install -e ".[eval]"'),
    ],
)
def test_an_optional_part_without_its_extra_is_one_line(
    core_site: str, command: list[str], needs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bhyt_pl.interpreter import python_command

    proc = run_core_only(core_site, "-m", "bhyt_pl", *command)
    monkeypatch.chdir(ROOT)  # where the subprocess ran: the interpreter as named from there
    # the line names the pip install into this interpreter's environment; from this checkout, editable
    expected = "error: " + needs.format(python=python_command())
    assert proc.returncode == 2 and proc.stderr.splitlines() == [expected], proc.stderr[-3000:]


def test_the_view_leaves_out_what_the_core_does_not_pull_in(tmp_path: Path) -> None:
    """The check is only as good as its view: the extras' modules are absent from it, the core's present."""
    folders = core_site_folders(tmp_path)
    names = {entry.name for folder in folders for entry in folder.iterdir()}
    assert {"torch", "lightning", "datasets", "yaml"} <= names
    assert not names & {*OPTIONAL_MODULES, "sklearn", "transformers", "pytest"}
    assert not [name for name in names if name.startswith(("scipy-", "submitit-", "lm_eval-"))]  # no metadata either

"""The optional parts: ``require``'s one line, and the extras of ``pyproject.toml`` it names (the core install
itself, run without them, is tests/test_core_install.py)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bhyt_pl.interpreter import python_command
from bhyt_pl.optional import EXTRAS, MissingExtra, missing_modules, require

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = PROJECT["optional-dependencies"]


def names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def expanded(extra: str) -> list[str]:
    """The requirements of ``extra``, with ``bhyt_pl[...]`` (the package's own extras) replaced by theirs."""
    out = []
    for text in OPTIONAL[extra]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
            out += [r for inner in sorted(requirement.extras) for r in expanded(inner)]
        else:
            out.append(text)
    return out


def test_a_missing_module_is_one_line_naming_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    require("study")  # all installed here: nothing raised
    monkeypatch.setitem(sys.modules, "submitit", None)  # what ``import submitit`` sees when it is not installed
    monkeypatch.chdir(ROOT)
    with pytest.raises(MissingExtra) as err:
        require("study")
    # from the checkout this package runs from: editable, into this interpreter's environment
    assert str(err.value) == f'the study needs submitit: {python_command()} -m pip install -e ".[study]"'
    assert isinstance(err.value, ImportError) and err.value.name == "submitit"
    monkeypatch.setitem(sys.modules, "scipy", None)
    assert missing_modules("study") == ["scipy", "submitit"]
    with pytest.raises(MissingExtra, match=r"^the study needs scipy and submitit: "):
        require("study")


def test_an_installed_package_names_the_package_index(tmp_path: Path) -> None:
    """Away from a checkout (no pyproject.toml above the package) the line installs ``"bhyt_pl[extra]"``."""
    package = tmp_path / "site-packages" / "bhyt_pl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module in ("optional.py", "interpreter.py"):  # optional.py and what it imports: nothing else of the package
        (package / module).write_text((ROOT / "bhyt_pl" / module).read_text())
    code = "from bhyt_pl.optional import install_command; print(install_command('eval'))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(package.parent)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f'{sys.executable} -m pip install "bhyt_pl[eval]"'


def test_the_core_needs_no_extra_and_dev_installs_them_all() -> None:
    core = names(PROJECT["dependencies"])
    assert "torch==2.13.0" in PROJECT["dependencies"]  # exact pin (the cached CPU wheel)
    assert not core & {"lm-eval", "scipy", "submitit"}
    assert not core & names(OPTIONAL["eval"] + OPTIONAL["study"])
    dev = expanded("dev")
    assert set(OPTIONAL["eval"]) | set(OPTIONAL["study"]) <= set(dev)


def test_each_extra_a_part_requires_is_in_pyproject_with_the_modules_it_installs() -> None:
    """``EXTRAS`` names an extra of pyproject.toml, and its modules are what that extra's distributions install
    (checked where they are installed: the test suite's environment has ``eval`` and ``study``)."""
    installed = importlib.metadata.packages_distributions()
    checked = []
    for extra, part in EXTRAS.items():
        assert extra in OPTIONAL, f"{extra!r} is not an extra of pyproject.toml"
        if not all(module in installed for module in part.modules):
            continue
        owners = {canonicalize_name(dist) for module in part.modules for dist in installed[module]}
        assert owners == names(OPTIONAL[extra]), extra
        checked.append(extra)
    assert {"eval", "study"} <= set(checked)


def test_the_error_lines_name_extras_that_exist() -> None:
    """Every ``pip install ...[extra]`` the package or its docs print names an extra of pyproject.toml."""
    named = set()
    for path in [*ROOT.glob("bhyt_pl/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]:
        named |= set(re.findall(r'pip install (?:-e )?"?(?:\.|bhyt_pl)\[([\w,-]+)\]', path.read_text()))
    assert named, "the pattern finds the install lines"
    for group in named:
        assert set(group.split(",")) <= set(OPTIONAL), group

"""The repository stands alone: no file points outside it, and every pointer into docs/method.md names a
section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".cache", ".ruff_cache", ".pytest_cache", "__pycache__", "runs", "build", "site"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ""}
OUTSIDE = re.compile(r"\.\./shared|shared/spec|spec sections? \d", re.IGNORECASE)
POINTER = re.compile(r"docs/method\.md,? sections? (\d+)(?:\s*(?:-|and)\s*(\d+))?")
THIS_FILE = Path(__file__).resolve()


def _text_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_file() and not SKIP_DIRS.intersection(rel.parts) and path.suffix in TEXT_SUFFIXES:
            if path.resolve() != THIS_FILE and not rel.parts[0].startswith(".egg") and "egg-info" not in str(rel):
                files.append(path)
    return files


def test_no_file_refers_outside_the_repository() -> None:
    offenders = []
    for path in _text_files():
        text = path.read_text(errors="ignore")
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    assert not offenders, offenders


def test_pointers_into_docs_method_name_existing_sections() -> None:
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", (ROOT / "docs/method.md").read_text(), flags=re.M)}
    assert sections == set(range(1, max(sections) + 1)) and len(sections) >= 9
    pointers = 0
    for path in _text_files():
        for match in POINTER.finditer(path.read_text(errors="ignore")):
            pointers += 1
            for number in filter(None, match.groups()):
                assert int(number) in sections, f"{path.relative_to(ROOT)}: {match.group(0)!r}"
    assert pointers > 20


def test_the_outside_pattern_ignores_case() -> None:
    for text in ("Spec sections 2-3.", "spec section 4", "see Shared/Spec/bhyt.md", "../SHARED/x"):
        assert OUTSIDE.search(text), text
    assert not OUTSIDE.search("docs/method.md, sections 2-3")


def test_no_two_test_modules_share_a_basename() -> None:
    """pytest imports a test file outside a package by its basename: a second file of that name fails collection."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue  # a package's modules are imported by their dotted name
        first = seen.setdefault(path.name, path)
        assert first == path, f"{first.relative_to(ROOT)} and {path.relative_to(ROOT)} share a basename"


def test_every_study_module_has_its_own_test_file() -> None:
    """``bhyt_pl/study/<subpackage>/<module>.py`` is tested in ``tests/study/test_<module>.py``, or
    ``test_<subpackage>_<module>.py`` where two subpackages have a module of that name (``cli/exploration.py`` and
    ``report/exploration.py``), or ``test_study_<module>.py`` where another package has one (``bench``'s
    ``command.py``)."""
    tests = {p.name for p in (ROOT / "tests" / "study").glob("test_*.py")}
    modules = [m for m in sorted((ROOT / "bhyt_pl" / "study").rglob("*.py")) if not m.name.startswith("__")]
    assert len(modules) > 40  # the glob finds the subpackages' modules
    missing = [
        str(module.relative_to(ROOT))
        for module in modules
        if not {f"test_{module.name}", f"test_study_{module.name}", f"test_{module.parent.name}_{module.name}"} & tests
    ]
    assert not missing, f"study modules without a test file: {missing}"

"""Outside ``bhyt_pl/norms/``, code asks a scheme through its interface (``BlockNorms.site_statistics``,
``NormScheme.diagnostics``): no comparison with a scheme's name and no ``getattr``/``hasattr`` on norm objects.
``convert.py``'s rmsnorm <-> Llama mapping is the one legitimate name check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bhyt_pl.norms import registered_norms

PACKAGE = Path(__file__).resolve().parents[1] / "bhyt_pl"
EXEMPT = {"norms", "convert.py"}
ALLOWED: set[tuple[str, str]] = set()
"""``(file, snippet)`` pairs that may match a pattern; empty: every tool asks the scheme through an interface."""


def _patterns() -> list[re.Pattern[str]]:
    names = "|".join(re.escape(n) for n in sorted(registered_norms(), key=len, reverse=True))
    name = rf"""["'](?:{names})["']"""
    return [
        re.compile(rf"(?:==|!=)\s*{name}"),  # x == "bhyt"
        re.compile(rf"{name}\s*(?:==|!=)"),  # "bhyt" == x
        re.compile(rf"\b(?:not\s+)?in\s*[(\[{{]\s*{name}"),  # x in ("bhyt", ...)
        re.compile(rf"{name}\s+(?:not\s+)?in\s+[\w(\[{{]"),  # "bhyt" in steps
        re.compile(r"\b(?:\w*scheme\w*|norms|site)(?:\(\))?\.name\s*(?:==|!=)"),  # scheme.name == other
        re.compile(r"\b(?:getattr|hasattr)\(\s*(?:[\w.]+\.)?(?:norms|site|\w*scheme)\b"),
    ]


def _violations(text: str) -> list[tuple[int, str]]:
    patterns = _patterns()
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1) if any(p.search(line) for p in patterns)]


@pytest.mark.parametrize(
    "line",
    [
        'if scheme.name == "bhyt":',
        'if "rmsnorm" != cfg.norm:',
        'family = [g for g in groups if g.norm in ("bhyt", "bhyt_exact")]',
        "if config.norm_scheme().name != other.name:",
        'approximated = getattr(norms, "approximate", False)',
        'if hasattr(block.norms, "pre_attn"):',
        'if hasattr(site, "spread"):',
        'if "bhyt" in steps:',
        'if PEER in peer and "rmsnorm" not in entries:',
    ],
)
def test_the_patterns_catch_what_they_forbid(line: str) -> None:
    assert _violations(line)


def test_the_patterns_leave_interface_calls_alone() -> None:
    ok = 'stats = norms.site_statistics(site, args)\nif r.status == "ok":\nratio(entries, "bhyt", "rmsnorm")\n'
    assert _violations(ok) == []


def test_no_scheme_name_comparison_or_norm_attribute_probe_outside_norms() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in EXEMPT:
            continue
        for i, line in _violations(path.read_text()):
            if not any(rel == file and snippet in line for file, snippet in ALLOWED):
                found.append(f"bhyt_pl/{rel}:{i}: {line}")
    assert not found, "ask the scheme through its interface instead:\n" + "\n".join(found)

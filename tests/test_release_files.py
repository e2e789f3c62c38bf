"""CITATION.cff and CHANGELOG.md: the citation is valid CFF 1.2.0 and agrees with pyproject.toml and with the paper the
documentation cites; the changelog keeps Keep a Changelog's shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CITATION = yaml.safe_load((ROOT / "CITATION.cff").read_text())

CFF_KEYS = {
    "abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers", "keywords",
    "license", "license-url", "message", "preferred-citation", "references", "repository", "repository-artifact",
    "repository-code", "title", "type", "url", "version",
}  # fmt: skip
"""The keys CFF 1.2.0 allows at the top level (its schema has no others)."""
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}
CHANGE_TYPES = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_citation_has_cff_1_2_0_keys_and_the_packages_version_and_licence() -> None:
    assert CITATION["cff-version"] == "1.2.0"
    assert CFF_REQUIRED <= set(CITATION) <= CFF_KEYS, set(CITATION) - CFF_KEYS
    assert CITATION["type"] == "software" and CITATION["authors"]
    assert str(CITATION["version"]) == PROJECT["version"]
    assert CITATION["license"] == PROJECT["license"]["text"]


def test_the_preferred_citation_is_the_paper_the_documentation_cites() -> None:
    """The arXiv id README.md gives for BHyT, the authors and venue docs/method.md gives."""
    paper = CITATION["preferred-citation"]
    arxiv = re.search(r"BHyT \(Bounded Hyperbolic Tanh, \[arXiv (\d{4}\.\d{5})\]", (ROOT / "README.md").read_text())
    cited = re.search(r"Hyperbolic Tangent; ([\w ,]+?), \[arXiv (\d{4}\.\d{5})\][^,]*,\s+(\w+) (\d{4});", (
        ROOT / "docs" / "method.md").read_text())  # fmt: skip
    assert arxiv and cited and arxiv.group(1) == cited.group(2)
    authors, venue, year = cited.group(1).split(", "), cited.group(3), int(cited.group(4))
    assert [a["family-names"] for a in paper["authors"]] == authors
    assert paper["url"] == f"https://arxiv.org/abs/{arxiv.group(1)}"
    assert {"type": "other", "value": f"arXiv:{arxiv.group(1)}"}.items() <= paper["identifiers"][0].items()
    assert paper["year"] == year and paper["conference"]["name"] == f"{venue} {year}"
    assert paper["type"] == "conference-paper" and "Bounded Hyperbolic" in paper["title"]


def test_the_changelog_keeps_keep_a_changelogs_shape() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    releases = re.findall(r"^## (.+)$", text, flags=re.M)
    assert releases[0] == "[Unreleased]"
    for heading in releases[1:]:  # a release: its version and date
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", heading), heading
    kinds = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert kinds - {"History"} <= CHANGE_TYPES and "Changed" in kinds

"""The registry of study kinds (``bhyt_pl.study.cli.kinds``): the built-in kinds are found by their command word, the
default kind takes a command line without one, and a kind cannot take a name or a command already taken."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from bhyt_pl.study.cli.kinds import (
    KINDS,
    PreparedStudy,
    StudyKind,
    kind_for_command,
    register_kind,
    study_parser,
    unregister_kind,
)
from bhyt_pl.study.record.results import StudyRecord


class Empty(StudyKind):
    name = "empty"
    command = "empty"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--size", type=int, default=1)

    def prepare(self, values: Mapping[str, object], argv: Sequence[str]) -> PreparedStudy:
        raise AssertionError("not prepared in these tests")

    def render(self, out: Path, record: StudyRecord, figures: bool = True) -> dict[str, Path]:
        raise AssertionError("not rendered in these tests")


@pytest.fixture
def empty() -> Iterator[Empty]:
    kind = register_kind(Empty())
    yield kind
    unregister_kind(kind.name)


def test_a_command_word_selects_its_kind_and_none_selects_the_default(empty: Empty) -> None:
    from bhyt_pl.study.cli import confirmation, exploration  # noqa: F401  (the built-in kinds register on import)

    assert kind_for_command(["empty", "--size", "2"]) == (empty, ["--size", "2"])
    kind, rest = kind_for_command(["confirm", "--pilot", "p"])
    assert kind.name == "confirmation" and rest == ["--pilot", "p"]
    kind, rest = kind_for_command(["--quick"])
    assert kind.name == "exploration" and rest == ["--quick"]


def test_the_shared_parser_adds_the_drivers_options_to_a_kinds_own(empty: Empty) -> None:
    args = study_parser(empty).parse_args(
        ["--size", "3", "--out", "o", "--restart", "--dry-run", "--launcher", "local"]
    )
    assert (args.size, args.out, args.restart, args.dry_run, args.launcher) == (3, Path("o"), True, True, "local")
    with pytest.raises(SystemExit):
        study_parser(empty).parse_args(["--siz", "3"])  # no abbreviations: an unknown flag


def test_a_kind_cannot_take_a_name_or_a_command_already_taken(empty: Empty) -> None:
    with pytest.raises(ValueError, match="clashes with"):
        register_kind(Empty())
    other = Empty()
    other.name = "other"  # the same command word
    with pytest.raises(ValueError, match="clashes with"):
        register_kind(other)
    assert "empty" in KINDS and "other" not in KINDS

"""The study's argument parser (``bhyt_pl.study.cli.arguments``): every parse error one line naming ``--help`` with exit
status 2 and no usage dump, an unrecognized flag named with the nearest accepted one, no abbreviations, and
``--help`` in full."""

from __future__ import annotations

import pytest

from bhyt_pl.study.cli.arguments import StudyArgumentParser, closest_option


def _parser() -> StudyArgumentParser:
    p = StudyArgumentParser(prog="python -m bhyt_pl study")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--seeds", type=int, help="evaluation seeds")
    p.add_argument("--lrs", type=float, nargs="+", help="learning rates")
    p.add_argument("--launcher", choices=("pool", "local"), default="pool", help="where runs train")
    return p


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1  # one line, no usage
    return captured.err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--stpes", "5"], "error: unrecognized argument --stpes; did you mean --steps?"),
        (["--step", "5"], "error: unrecognized argument --step; did you mean --steps?"),  # no abbreviation
        (["--stpes=5"], "error: unrecognized argument --stpes; did you mean --steps?"),
        (
            ["--stpes", "5", "--lrz", "1e-3"],
            "error: unrecognized arguments --stpes (did you mean --steps?), --lrz (did you mean --lrs?)",
        ),
        (["--zzzzzz"], "error: unrecognized argument --zzzzzz"),
        (["stray"], "error: unrecognized argument 'stray'"),
        (["--steps", "many"], "error: argument --steps: invalid int value: 'many'"),
        (["--launcher", "cloud"], "error: argument --launcher: invalid choice: 'cloud' (choose from 'pool', 'local')"),
    ],
)
def test_a_parse_error_is_one_line_naming_help(argv: list[str], line: str, capsys: pytest.CaptureFixture) -> None:
    assert _error(argv, capsys) == f"{line} (options: python -m bhyt_pl study --help)\n"


def test_help_is_in_full(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m bhyt_pl study [-h]") and "optimizer steps" in text
    assert _parser().parse_args(["--steps", "5", "--lrs", "1e-3", "3e-3"]).lrs == [1e-3, 3e-3]


def test_the_closest_option_is_a_near_spelling_or_the_one_flag_a_prefix_starts() -> None:
    options = ["--steps", "--seeds", "--seq-len", "--trajectory-every"]
    assert closest_option("--stpes", options) == "--steps"
    assert closest_option("--traj", options) == "--trajectory-every"  # the only flag it starts
    assert closest_option("--seed", options) == "--seeds"  # an abbreviation
    assert closest_option("--xyz", options) is None

"""The argument parser of ``python -m bhyt_pl study`` and ``study confirm``: argparse with one-line errors.

argparse answers a mistyped flag with the whole usage (about 40 lines for the study) before its error, reads
an abbreviation as the flag it abbreviates (``--step 5`` as ``--steps 5``, ``--seed 43`` as ``--seeds 43``), and
names a value's problem after the flag even when a ``--config`` file set it. ``StudyArgumentParser`` prints every
parse error as one line, ``error: <what> (options: <command> --help)``, with exit status 2; an unrecognized flag
names the nearest accepted one; abbreviations are off. ``--help`` is argparse's, in full.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["StudyArgumentParser", "closest_option"]


def closest_option(word: str, options: Sequence[str]) -> str | None:
    """The accepted option nearest to ``word`` (a typo or an abbreviation), or None when none is close."""
    flag = word.partition("=")[0]
    found = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
    if found:
        return found[0]
    longer = sorted(option for option in options if option.startswith(flag) and len(flag) > 2)
    return longer[0] if len(longer) == 1 else None


class StudyArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line naming the command's ``--help`` (module docstring).

    Example:
        >>> p = StudyArgumentParser(prog="python -m bhyt_pl study")
        >>> _ = p.add_argument("--steps", type=int)
        >>> p.parse_args(["--stpes", "5"])  # doctest: +SKIP
        error: unrecognized argument --stpes; did you mean --steps? (options: python -m bhyt_pl study --help)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False  # --step is not --steps: an abbreviation is an unrecognized flag
        super().__init__(*args, **kwargs)

    def long_options(self) -> list[str]:
        """Every ``--flag`` a user may type (suppressed ones, e.g. removed flags, excepted)."""
        return [
            flag
            for action in self._actions  # argparse exposes no public list of its actions
            if action.help != argparse.SUPPRESS
            for flag in action.option_strings
            if flag.startswith("--")
        ]

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        """argparse's ``parse_args``, whose leftover words are named with the nearest accepted flag."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized_text(extras))
        return parsed

    def unrecognized_text(self, extras: Sequence[str]) -> str:
        """``unrecognized argument --stpes; did you mean --steps?``: the flags among ``extras`` (a flag's value
        left over with it is not named), else the stray words."""
        flags = [word for word in extras if word.startswith("-") and len(word) > 1]
        if not flags:
            return f"unrecognized argument{'s' if len(extras) > 1 else ''} {' '.join(map(repr, extras))}"
        parts = []
        for flag in flags:
            near = closest_option(flag, self.long_options())
            parts.append(flag.partition("=")[0] + (f" (did you mean {near}?)" if near and len(flags) > 1 else ""))
        text = f"unrecognized argument{'s' if len(flags) > 1 else ''} {', '.join(parts)}"
        near = closest_option(flags[0], self.long_options()) if len(flags) == 1 else None
        return text + (f"; did you mean {near}?" if near else "")

    def error(self, message: str) -> NoReturn:
        """The message as one line after ``error:``, naming ``--help`` (no usage dump), and exit status 2."""
        sys.stderr.write(f"error: {message} (options: {self.prog} --help)\n")
        raise SystemExit(2)

"""Temporary: dispatch to the two commands until the shared driver lands."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from bhyt_pl.study.cli import confirmation, exploration

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["confirm"]:
        return confirmation.main(argv[1:])
    return exploration.main(argv)

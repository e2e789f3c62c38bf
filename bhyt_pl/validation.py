"""One way to report invalid arguments: collect every problem, then raise once (style practice 10)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["raise_if_problems"]


def raise_if_problems(subject: str, problems: Sequence[str]) -> None:
    """Raise one ``ValueError`` listing every problem, or return when there is none.

    Example:
        >>> raise_if_problems("LlamaLM arguments", ["lr must be > 0, got 0"])
        Traceback (most recent call last):
        ...
        ValueError: invalid LlamaLM arguments:
          - lr must be > 0, got 0
    """
    if problems:
        raise ValueError(f"invalid {subject}:\n  - " + "\n  - ".join(problems))

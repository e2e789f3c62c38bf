"""The one exception type for problems the user fixes (a bad setting, a missing or foreign file).

``python -m bhyt_pl`` prints a ``UsageError`` as one short message without a traceback; Python
callers catch it as the ``ValueError`` it is.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A problem in the user's input or environment; the message names the field or file and the fix.

    ``every_rank=True`` marks an error that every rank of a multi-process run raises from the same inputs (a
    setting, the shared data): the command line prints it once, from rank 0, instead of once per rank.
    """

    def __init__(self, message: str, *, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank

"""The exception types for problems the user fixes (a bad setting, a missing or foreign file, a full disk), and
the walk that finds the cause inside the errors torch and Lightning wrap it in.

``python -m bhyt_pl`` prints a ``UsageError`` as one short message without a traceback; Python
callers catch it as the ``ValueError`` it is.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["AgreedUsageError", "UsageError", "exception_chain"]


class UsageError(ValueError):
    """A problem in the user's input or environment; the message names the field or file and the fix."""


class AgreedUsageError(UsageError):
    """A ``UsageError`` that every rank of a multi-process run raises with the same message, from the same inputs
    (a setting, the shared data) or after the ranks agreed on it (rank 0 found it and broadcast it): the command
    line prints it once, from rank 0, instead of once per rank."""


def exception_chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, its causes and contexts, and the per-rank failures inside torch's ``CheckpointException``."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        todo += [exc.__cause__, exc.__context__]
        failures = getattr(exc, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values() if f is not None]

"""The one exception type for problems the user fixes (a bad setting, a missing or foreign file).

``python -m bhyt_pl`` prints a ``UsageError`` as one short message without a traceback; Python
callers catch it as the ``ValueError`` it is.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A problem in the user's input or environment; the message names the field or file and the fix."""

"""How to call the interpreter that runs this process, as the lines the package prints spell it for the user."""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["python_command"]


def python_command() -> str:
    """How to call this interpreter from the working directory: ``.venv/bin/python`` for the quick start's
    environment (a bare ``python`` there would be the system's, without torch), ``python`` when that is the one
    on ``PATH``, else its absolute path."""
    executable = os.path.abspath(sys.executable)
    on_path = shutil.which("python")
    if on_path is not None and os.path.abspath(on_path) == executable:
        return "python"
    relative = os.path.relpath(executable)
    return executable if relative.startswith("..") else relative

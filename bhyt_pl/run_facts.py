"""The facts a run knows about itself, built in one place (docs/method.md, section 9).

A norm scheme may need to know something about the run that trains it (BHyT's ``seq_len``, the ``T`` of
``c = ||W_V W_O||_F^2 / (T d)``): it lists those facts in ``NormScheme.run_facts``, and
``bhyt_pl.run_config.build_run_config`` binds them. The facts themselves come from here:
``build_run_facts(seq_len=..., batch_size=...)`` takes the settings every entry point has (the data modules
from their arguments; the bench and the GPU scripts, which have no data module, from their own flags) and
returns every registered fact. A new fact is one ``@register_run_fact`` function of those settings and
reaches every entry point without an edit there.

Example:
    >>> build_run_facts(seq_len=256, batch_size=8)
    {'seq_len': 256, 'batch_size': 8}
    >>> build_run_facts(seq_len=256)  # a fact the run cannot know is absent
    {'seq_len': 256}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RunSettings", "build_run_facts", "complete_run_facts", "register_run_fact", "registered_run_facts"]


@dataclass(frozen=True)
class RunSettings:
    """What every entry point knows about its run; each run fact is computed from these."""

    seq_len: int | None = None
    """Tokens per training sequence (the data module's ``seq_len``, LIMA's ``max_seq_len``)."""
    batch_size: int | None = None
    """Sequences per optimizer step on one device."""

    def __post_init__(self) -> None:
        problems = [
            f"{f.name} must be a positive int or None, got {getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if not _positive_int_or_none(getattr(self, f.name))
        ]
        if problems:
            raise ValueError("invalid run settings: " + "; ".join(problems))


def _positive_int_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


RunFact = Callable[[RunSettings], Any]
"""A fact's value from the run's settings; ``None`` when the settings do not determine it."""

_FACTS: dict[str, RunFact] = {}


def register_run_fact(name: str) -> Callable[[RunFact], RunFact]:
    """Declare the run fact ``name``, computed by the decorated function from ``RunSettings``.

    Example::

        @register_run_fact("tokens_per_step")
        def tokens_per_step(run: RunSettings) -> int | None:
            return run.seq_len * run.batch_size if run.seq_len and run.batch_size else None
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a run fact's name must be an identifier (it is a scheme's argument), got {name!r}")

    def decorator(fact: RunFact) -> RunFact:
        if name in _FACTS:
            raise ValueError(f"run fact {name!r} is already registered; registered: {', '.join(_FACTS)}")
        _FACTS[name] = fact
        return fact

    return decorator


def registered_run_facts() -> list[str]:
    """Names of the registered run facts, in registration order."""
    return list(_FACTS)


@register_run_fact("seq_len")
def _seq_len(run: RunSettings) -> int | None:
    return run.seq_len


@register_run_fact("batch_size")
def _batch_size(run: RunSettings) -> int | None:
    return run.batch_size


def build_run_facts(seq_len: int | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Every registered run fact of a run with these settings (``RunSettings``); facts they leave
    undetermined (``None``) are left out.

    Raises:
        ValueError: a setting that is not a positive int or None.
    """
    run = RunSettings(seq_len=seq_len, batch_size=batch_size)
    facts = {name: fact(run) for name, fact in _FACTS.items()}
    return {name: value for name, value in facts.items() if value is not None}


def complete_run_facts(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` plus every fact derivable from the settings among it (``LlamaLM(seq_len=..., run_facts=...)``
    given by hand rather than by a data module); the values in ``given`` win."""
    settings = {f.name: given.get(f.name) for f in dataclasses.fields(RunSettings)}
    return {**build_run_facts(**settings), **{k: v for k, v in given.items() if v is not None}}

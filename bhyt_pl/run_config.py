"""A run's model configuration, built in one place (docs/method.md, section 9).

``build_run_config`` takes the preset, the norm (a registry name or a scheme instance), its arguments,
the ``LlamaConfig`` overrides and the facts the run knows about itself (``seq_len``, ``batch_size``, ...,
made by ``bhyt_pl.run_facts.build_run_facts``), and returns one validated ``LlamaConfig`` that holds its
resolved norm scheme, bound to the facts that scheme declares (``NormScheme.run_facts``). The CLI,
``LlamaLM`` (fine-tuning included), the study, the bench and the GPU scripts all build their configs here,
so a scheme that declares a run fact needs no edit outside its own file, and a new run fact needs only its
``register_run_fact`` declaration: every entry point already passes every fact it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from lightning.pytorch.utilities import rank_zero_warn

from bhyt_pl.config import LlamaConfig
from bhyt_pl.norms import NormScheme
from bhyt_pl.run_facts import complete_run_facts, registered_run_facts

__all__ = [
    "RunFactsSource",
    "build_run_config",
    "data_run_facts",
    "data_tokenizer",
    "resolve_unbound",
    "warn_if_unbound",
]


@runtime_checkable
class RunFactsSource(Protocol):
    """What a data module tells the model about the run it feeds (``C4DataModule``, ``LIMADataModule``)."""

    def run_facts(self) -> dict[str, Any]:
        """Facts about the run by name: ``seq_len`` (the training sequence length), ``batch_size``, ..."""
        ...


def data_run_facts(data: Any) -> dict[str, Any]:
    """The run facts a data module declares (``RunFactsSource``); none for a data module that declares none."""
    return dict(data.run_facts()) if isinstance(data, RunFactsSource) else {}


def data_tokenizer(data: Any) -> str | None:
    """The tokenizer name or path a data module reads with (its ``tokenizer`` attribute when that is a string):
    what ``LlamaLM`` records so evaluation can rebuild the tokenizer."""
    value = getattr(data, "tokenizer", None)
    return value if isinstance(value, str) else None


def build_run_config(
    preset: str = "tiny",
    norm: str | NormScheme = "rmsnorm",
    norm_args: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    run_facts: Mapping[str, Any] | None = None,
    *,
    base: LlamaConfig | None = None,
    warn_unbound: bool = True,
) -> LlamaConfig:
    """The ``LlamaConfig`` of one run, its norm scheme resolved once and bound to the run's facts.

    Args:
        preset: model preset (``bhyt_pl.PRESETS``); ignored with ``base``.
        norm: a registered norm name, or a ``NormScheme`` instance (then ``norm_args`` must be empty);
            ignored with ``base``.
        norm_args: constructor arguments of the norm; with ``base``, updates of the base config's norm
            arguments (each must be an argument of its scheme).
        overrides: ``LlamaConfig`` fields that replace the preset's (or the base config's).
        run_facts: every fact this run knows about itself, e.g. ``{"seq_len": 256, "batch_size": 8}``
            (``build_run_facts``); facts derivable from the settings among them are added
            (``complete_run_facts``). The scheme takes those it declares and ignores the rest, ``None`` values
            included.
        base: the config of a checkpoint this run starts from (fine-tuning); its facts are re-bound to
            this run's (the released code sets BHyT's T from the current run every time it builds a model).
        warn_unbound: warn when a fact the scheme declares is still unknown (``warn_if_unbound``); ``LlamaLM``
            turns it off while it may still learn the facts from its data module, and warns when it builds the model.

    A fact the norm arguments set explicitly is kept, with a warning when it differs from the run's; a
    declared fact the run does not know warns (the scheme falls back to its documented default). A
    ``seq_len`` longer than the model's ``max_seq_len`` is an error.

    Example:
        >>> build_run_config("tiny", "bhyt", run_facts={"seq_len": 256, "batch_size": 8}).norm_args
        {'seq_len': 256}
        >>> build_run_config("tiny", "rmsnorm", run_facts={"seq_len": 256}).norm_args
        {}
    """
    norm_args, overrides = dict(norm_args or {}), dict(overrides or {})
    facts = complete_run_facts(run_facts or {})
    if base is None:
        if isinstance(norm, NormScheme):
            if norm_args:
                raise ValueError("norm_args is only for a norm given by name; put them in the scheme's init_args")
            name, args = norm.name, norm.hparams()
        else:
            name, args = norm, norm_args
        config = LlamaConfig.from_name(preset, **{**overrides, "norm": name, "norm_args": args})
        scheme = config.norm_scheme()
        explicit = set(scheme.run_facts) - set(scheme.unbound_run_facts())  # set by the norm arguments
    else:
        accepted = set(base.norm_scheme().hparams())
        unknown = sorted(set(norm_args) - accepted)
        if unknown:
            raise ValueError(
                f"norm_args {unknown} are not arguments of the checkpoint's norm {base.norm!r}; "
                f"it accepts: {', '.join(sorted(accepted))}"
            )
        config = LlamaConfig(**{**base.to_dict(), **overrides, "norm_args": {**base.norm_args, **norm_args}})
        explicit = set(norm_args) & set(config.norm_scheme().run_facts)
    seq_len = facts.get("seq_len")
    if seq_len is not None and seq_len > config.max_seq_len:
        raise ValueError(
            f"seq_len={seq_len} exceeds the model's max_seq_len={config.max_seq_len}; "
            "raise it with model.overrides: {max_seq_len: ...}"
        )
    for fact in sorted(explicit):
        value = config.norm_args.get(fact)
        if facts.get(fact) is not None and facts[fact] != value:
            rank_zero_warn(
                f"norm {config.norm!r}: {fact}={value} is set in the norm arguments and kept; "
                f"this run's {fact} is {facts[fact]}"
            )
    config = config.bind(**{k: v for k, v in facts.items() if k not in explicit})
    if warn_unbound:
        warn_if_unbound(config)
    return config


def resolve_unbound(config: LlamaConfig) -> LlamaConfig:
    """The config a model is built from: ``config`` with each run fact still unbound set to the value its scheme
    falls back to (``NormScheme.fallback_run_facts``: BHyT's T = 1024), after a warning naming them
    (``warn_if_unbound``); ``config`` itself when every declared fact is bound. Whoever records the config
    (``LlamaLM``: its hparams and checkpoints) then records what the model was built with.

    Example:
        >>> resolve_unbound(build_run_config("tiny", "bhyt", run_facts={"seq_len": 256})).norm_args
        {'seq_len': 256}
    """
    warn_if_unbound(config)
    fallbacks = config.norm_scheme().fallback_run_facts()
    return config.bind(**fallbacks) if fallbacks else config


def warn_if_unbound(config: LlamaConfig) -> None:
    """Warn, naming them and the values they fall back to, about the run facts ``config``'s scheme declares but
    nobody bound (the scheme then uses its declared fallback, ``NormScheme.run_fact_fallbacks``: BHyT's T = 1024)."""
    unbound = config.norm_scheme().unbound_run_facts()
    unknown = [fact for fact in unbound if fact not in registered_run_facts()]
    if unknown:
        rank_zero_warn(
            f"norm {config.norm!r} declares the run fact(s) {unknown}, which no entry point can give: declare "
            f"them with bhyt_pl.run_facts.register_run_fact; registered run facts: {', '.join(registered_run_facts())}"
        )
    elif unbound:
        fallbacks = config.norm_scheme().fallback_run_facts()
        values = ", ".join(f"{fact}={fallbacks[fact]}" if fact in fallbacks else f"{fact} (its default)"
                           for fact in unbound)  # fmt: skip
        rank_zero_warn(
            f"norm {config.norm!r} needs the run fact(s) {unbound} but the run gave none: train it with a data "
            f"module that declares them (run_facts()), or pass them (LlamaLM(run_facts={{{unbound[0]!r}: ...}})); "
            f"the scheme falls back to {values} (docs/method.md, section 9)"
        )

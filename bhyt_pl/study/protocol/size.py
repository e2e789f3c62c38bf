"""The size of a study's runs: their model's parameter counts (``bhyt_pl.model_size``: P, the embedding, everything),
the tokens a run trains on, tokens per parameter (T/P) and, where the training data's size is known, how many of
those tokens are unique and how many passes over the data they make.

The study's ``meta`` holds one ``RunSize`` per model shape (``size``: one for the depth study, one per depth for the
sweep); its report and the dry run print ``RunSize.text``. Each run's ``result.json`` holds the same counts measured
on its own built model (``RunResult``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bhyt_pl.config import LlamaConfig
from bhyt_pl.model_size import ModelSize, block_params, embedding_params, tokens_per_param
from bhyt_pl.study.protocol.spec import RunSpec

__all__ = ["RunSize", "epochs", "run_sizes", "unique_tokens"]


def unique_tokens(tokens: int, corpus_tokens: int | None) -> int | None:
    """The distinct training tokens among ``tokens``: all of them within one pass over a corpus of
    ``corpus_tokens``, one pass's worth past it (later passes repeat the same tokens in a new order); None when the
    corpus's size is unknown."""
    return None if corpus_tokens is None else min(tokens, corpus_tokens)


def epochs(tokens: int, corpus_tokens: int | None) -> float | None:
    """Passes over the training data: ``tokens / corpus_tokens``; None when the corpus's size is unknown."""
    return None if not corpus_tokens else tokens / corpus_tokens


def _count(n: int) -> str:
    return f"{n:,}"


@dataclass(frozen=True)
class RunSize:
    """The size of the runs of one model shape.

    Args:
        n_layers: the shape's depth.
        block_params: P, the blocks' weight matrices (``bhyt_pl.model_size.block_params``).
        embedding_params: the embedding table.
        total_params: every parameter of the built model, by candidate (the schemes' norm parameters differ).
        tokens: training tokens a run sees (steps x batch x sequence length).
        corpus_tokens: training tokens one pass over the data gives (``C4DataModule.training_tokens_per_epoch``);
            None when unknown.
    """

    n_layers: int
    block_params: int
    embedding_params: int
    total_params: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    corpus_tokens: int | None = None

    @property
    def tokens_per_param(self) -> float:
        return tokens_per_param(self.tokens, self.block_params)

    @property
    def unique_tokens(self) -> int | None:
        return unique_tokens(self.tokens, self.corpus_tokens)

    @property
    def epochs(self) -> float | None:
        return epochs(self.tokens, self.corpus_tokens)

    def to_dict(self) -> dict[str, object]:
        """The meta entry: the fields and the derived figures (``tokens_per_param``, ``unique_tokens``, ``epochs``)."""
        return {
            "n_layers": self.n_layers,
            "block_params": self.block_params,
            "embedding_params": self.embedding_params,
            "total_params": dict(self.total_params),
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "corpus_tokens": self.corpus_tokens,
            "unique_tokens": self.unique_tokens,
            "epochs": self.epochs,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSize:
        corpus = data.get("corpus_tokens")
        return cls(
            int(data["n_layers"]),
            int(data["block_params"]),
            int(data["embedding_params"]),
            {str(k): int(v) for k, v in dict(data.get("total_params") or {}).items()},
            int(data.get("tokens", 0)),
            int(corpus) if corpus is not None else None,
        )

    def counts_text(self) -> str:
        """The parameter counts alone: P, everything (a range when the schemes' norm parameters differ), the
        embedding."""
        totals = sorted(set(self.total_params.values()))
        if not totals:
            everything = ""
        elif len(totals) == 1:
            everything = f", {_count(totals[0])} in all"
        else:
            everything = f", {_count(totals[0])} to {_count(totals[-1])} in all (the schemes' norm parameters differ)"
        return (
            f"{_count(self.block_params)} in block matrices (P){everything}, {_count(self.embedding_params)} embedding"
        )

    def text(self) -> str:
        """One line: the counts, T/P and, past one pass over the data, the tokens seen, unique tokens and epochs."""
        line = (
            f"{self.counts_text()}; tokens per run {_count(self.tokens)} = "
            f"{self.tokens_per_param:.3g} tokens per parameter (T/P)"
        )
        passes = self.epochs
        if passes is not None and passes > 1 and self.unique_tokens is not None:
            line += (
                f"; past the training data ({_count(self.unique_tokens)} tokens a pass): {_count(self.tokens)} tokens "
                f"seen, {_count(self.unique_tokens)} unique, {passes:.3g} epochs"
            )
        return line


def _config(spec: RunSpec) -> LlamaConfig:
    fields = {**spec.overrides, "norm": spec.norm, "norm_args": dict(spec.norm_args)}
    return LlamaConfig.from_name(spec.preset, **fields)


def run_sizes(specs: Sequence[RunSpec], tokens: int, corpus_tokens: int | None) -> list[RunSize]:
    """One ``RunSize`` per model shape (preset and overrides) of ``specs``, in their order, each with the total of
    every candidate that trains it (a meta-device build of each: no memory, no random numbers drawn)."""
    shapes: dict[str, tuple[LlamaConfig, dict[str, int]]] = {}
    for spec in specs:
        key = repr((spec.preset, sorted(spec.overrides.items())))
        candidate = spec.candidate or spec.norm
        if key in shapes and candidate in shapes[key][1]:
            continue  # another rate or seed of a shape and candidate already counted
        config = _config(spec)
        totals = shapes.setdefault(key, (config, {}))[1]
        totals[candidate] = ModelSize.of(config).total_params
    return [
        RunSize(config.n_layers, block_params(config), embedding_params(config), totals, tokens, corpus_tokens)
        for config, totals in shapes.values()
    ]

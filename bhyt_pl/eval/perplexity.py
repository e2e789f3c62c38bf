"""Token-level perplexity with a sliding window (docs/method.md, section 6: C4 and WikiText-2 after SFT).

Each document is scored as ``[BOS] ids`` (the C4 data module's layout; no EOS is scored). Windows
hold at most ``max_length`` input tokens; the first predicts the first ``max_length`` tokens, each
later one predicts the next ``stride`` tokens with the preceding ``max_length - stride`` as context.
``stride == max_length`` gives disjoint windows, lm-eval's ``loglikelihood_rolling``; any stride
gives exactly lm-eval's ``get_rolling_token_windows(..., context_len=max_length - stride + 1)``
(tests/eval/test_perplexity.py checks both).

Sources: ``c4`` (``allenai/c4`` ``en`` validation, documents scored one by one) and ``wikitext2``
(``Salesforce/wikitext`` ``wikitext-2-raw-v1`` test, joined with blank lines into one text, the usual
recipe). Offline, give local files: JSON lines (optionally gzipped) with a ``text`` field, or a plain
text file (one document, e.g. WikiText's ``wiki.test.raw``); ``c4=embedded`` uses the bundled
validation shards.

One process scores every document (``python -m bhyt_pl eval`` refuses to run as one of several processes).

Example:
    >>> from bhyt_pl.eval.perplexity import perplexity, load_texts
    >>> texts = load_texts("c4", "embedded", max_documents=10)  # doctest: +SKIP
    >>> perplexity(model, tokenizer, texts, stride=256).perplexity  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from bhyt_pl.data.tokenizer import EMBEDDED, SpecialTokens
from bhyt_pl.eval.scoring import score_rows
from bhyt_pl.model import Llama

__all__ = ["SOURCES", "PerplexityResult", "PerplexitySource", "load_texts", "perplexity", "sliding_windows"]


@dataclass(frozen=True)
class PerplexitySource:
    """Where a perplexity corpus lives on the Hub and how its rows become documents."""

    path: str
    name: str | None
    split: str
    field: str = "text"
    join: bool = False
    """Join all rows with blank lines into one document (WikiText) instead of one document per row (C4)."""


SOURCES: dict[str, PerplexitySource] = {
    "c4": PerplexitySource("allenai/c4", "en", "validation"),
    "wikitext2": PerplexitySource("Salesforce/wikitext", "wikitext-2-raw-v1", "test", join=True),
}


@dataclass
class PerplexityResult:
    """Summed negative log-likelihood over every scored token of a corpus."""

    nll: float
    """Sum of ``-log p(token)`` in nats."""
    tokens: int
    documents: int
    max_length: int
    stride: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "token_perplexity": self.perplexity, "nll_per_token": self.nll / max(self.tokens, 1)}


def sliding_windows(ids: Sequence[int], bos_id: int, max_length: int, stride: int) -> list[tuple[list[int], list[int]]]:
    """``(inputs, targets)`` windows covering ``ids``, each target predicted once, from ``[BOS] + ids``.

    A window's inputs are the ``<= max_length`` tokens before its last target, so its targets are the
    last ``len(targets)`` next tokens of its inputs.
    """
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride must be in [1, max_length={max_length}], got {stride}")
    seq = [bos_id, *ids]  # seq[t + 1] is predicted from seq[: t + 1]
    windows = []
    done = 0  # tokens of ``ids`` already predicted
    while done < len(ids):
        end = min(done + (max_length if done == 0 else stride), len(ids))  # predict ids[done:end]
        start = max(0, end - max_length)
        windows.append((seq[start:end], list(ids[done:end])))
        done = end
    return windows


def perplexity(
    model: Llama,
    tokenizer: Tokenizer,
    texts: Iterable[str],
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 16,
) -> PerplexityResult:
    """Token-level perplexity of ``model`` on ``texts`` (each its own ``[BOS] text`` document).

    Args:
        max_length: window length; default and maximum ``config.max_seq_len``.
        stride: new tokens per window after the first; default ``max_length // 2``.
    """
    limit = model.config.max_seq_len
    max_length = max_length or limit
    if not 1 <= max_length <= limit:
        raise ValueError(f"max_length must be in [1, config.max_seq_len={limit}], got {max_length}")
    stride = stride or max(1, max_length // 2)
    special = SpecialTokens.from_tokenizer(tokenizer)
    rows, documents = [], 0
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        rows.extend(sliding_windows(ids, special.bos_id, max_length, stride))
        documents += 1
    scores = score_rows(model.eval(), rows, batch_size, pad_id=special.pad_id, greedy=False)
    nll = -sum(logprob for logprob, _ in scores)
    tokens = sum(len(targets) for _, targets in rows)
    return PerplexityResult(nll, tokens, documents, max_length, stride)


def load_texts(
    source: str, data_files: str | Sequence[str] | None = None, max_documents: int | None = None
) -> list[str]:
    """Documents of a perplexity source: the Hub dataset of ``SOURCES[source]``, or local ``data_files``.

    Args:
        source: ``c4`` or ``wikitext2`` (decides Hub location and whether rows are joined).
        data_files: local files instead of the Hub: ``.txt``/``.raw`` files are one document each, anything
            else is read as JSON lines with a ``text`` field (gzip allowed); ``"embedded"`` is the bundled
            C4-format validation shards.
        max_documents: keep the first N documents (C4 validation has 364k); None keeps all.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown perplexity source {source!r}; sources: {', '.join(SOURCES)}")
    spec = SOURCES[source]
    if data_files is not None:
        texts = list(_read_local(data_files, max_documents))
    else:
        texts = list(_read_hub(spec, max_documents))
    if spec.join:
        texts = ["\n\n".join(texts)]
    if not texts or not any(t.strip() for t in texts):
        raise ValueError(f"perplexity source {source!r} ({data_files or spec.path}) has no text")
    return texts


def _read_local(data_files: str | Sequence[str], max_documents: int | None) -> Iterable[str]:
    from bhyt_pl.data.c4 import EMBEDDED_DATA_FILES, read_documents

    files = [data_files] if isinstance(data_files, str) else list(data_files)
    if files == [EMBEDDED]:
        files = EMBEDDED_DATA_FILES["validation"]
    missing = [f for f in files if not Path(f).exists()]
    if missing:
        raise FileNotFoundError(f"perplexity data file(s) {missing} do not exist")
    count = 0
    for f in files:
        if Path(f).suffix in (".txt", ".raw"):
            docs: Iterable[str] = [Path(f).read_text(encoding="utf-8")]
        else:
            docs = (row["text"] for row in read_documents([f]))
        for text in docs:
            if max_documents is not None and count >= max_documents:
                return
            count += 1
            yield text


def _read_hub(spec: PerplexitySource, max_documents: int | None) -> Iterable[str]:
    try:
        from datasets import load_dataset

        ds = load_dataset(spec.path, spec.name, split=spec.split, streaming=True)
        for i, row in enumerate(ds):
            if max_documents is not None and i >= max_documents:
                return
            yield row[spec.field]
    except (ConnectionError, OSError, ValueError) as err:  # offline / unreachable Hub: name the local fix
        raise RuntimeError(
            f"cannot stream {spec.path} ({spec.name}, {spec.split}) from the Hugging Face Hub "
            f"({type(err).__name__}: {err}). Offline, pass local files, e.g. "
            "`--ppl_data_files c4=/path/c4-validation.00000-of-00008.json.gz wikitext2=/path/wiki.test.raw` "
            "(or `c4=embedded` for the bundled corpus)."
        ) from err

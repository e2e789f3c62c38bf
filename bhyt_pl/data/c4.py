"""C4 for pretraining (docs/method.md, section 6): streamed, tokenized with BOS/EOS per document, packed into
fixed ``seq_len + 1`` windows, sharded per rank and per DataLoader worker, resumable mid-epoch.

Pipeline of one stream (a rank's DataLoader worker, or the rank itself with ``num_workers=0``)::

    shard files --split_dataset_by_node--> this rank's files --shard--> this stream's files
      --shuffle(seed, buffer, epoch)--> documents --encode_batch--> [BOS] ids [EOS] ... --pack--> windows [L+1]

Batches are ``{"input_ids": window[:, :-1], "labels": window[:, 1:]}``, both [B, L].

Validation, test and predict read the validation split differently: one stream of every file in order, unshuffled,
read by every rank, which keeps its equal share of the first windows (``bhyt_pl.data.eval_set``).
"""

from __future__ import annotations

import glob
import gzip
import json
import logging
import lzma
import os
import zlib
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bhyt_pl.data.eval_set import EvalSet, SharedStream, eval_set, eval_stages
from bhyt_pl.data.tokenizer import ASSETS_DIR, EMBEDDED, HUB_TOKENIZER, SpecialTokens, load_tokenizer
from bhyt_pl.errors import UsageError
from bhyt_pl.run_facts import build_run_facts
from bhyt_pl.validation import raise_if_problems

__all__ = [
    "EMBEDDED_DATA_FILES",
    "EMBEDDED_TRAIN_TOKENS",
    "C4DataModule",
    "PackedWindows",
    "ResumableLoader",
    "collate_fixed_windows",
    "read_documents",
]

log = logging.getLogger(__name__)

EMBEDDED_DATA_FILES: dict[str, list[str]] = {
    "train": [str(ASSETS_DIR / f"c4-train.{i:05d}-of-00008.json.gz") for i in range(8)],
    "validation": [str(ASSETS_DIR / f"c4-validation.{i:05d}-of-00002.json.gz") for i in range(2)],
}
"""Absolute paths of the embedded C4-format shards (King James Bible, see ``assets/README.md``)."""

EMBEDDED_TRAIN_TOKENS = 948_868
"""Tokens of the embedded training split as ``PackedWindows`` reads them: every document's ids with its BOS and EOS
(1,159 documents). Counted once and kept here, since counting means tokenizing the whole split (a few seconds);
tests/data/test_c4.py counts them again."""

_ENCODE_BATCH = 64  # documents per encode_batch call: amortizes the Python/Rust crossing


# ----------------------------------------------------------------------------- reading
_UNREADABLE = (EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError)
"""What a truncated or corrupted compressed shard raises part-way (``BadGzipFile`` also on a non-gzip file)."""


def read_documents(
    files: list[str], skipped: Counter | None = None, unreadable: dict[str, str] | None = None
) -> Iterator[dict[str, str]]:
    """Yield ``{"text": ...}`` for every valid line of C4-format JSON-lines ``files`` (gzip or plain,
    local or any fsspec URL such as ``hf://datasets/allenai/c4/...``).

    A line that is not JSON, has no ``text`` or a non-string ``text`` is skipped and counted in
    ``skipped`` (keys ``not_json``, ``no_text``, ``text_not_str``); each file's count is logged. A file
    without any line is logged and counted as ``empty_shard``. This
    reader replaces ``datasets``' JSON builder, which aborts the whole shard on one malformed line.

    A shard that breaks part-way (truncated download, corrupted gzip) keeps the documents read before
    the break; the rest of it is skipped, logged with its name and the reason, counted in ``skipped``
    as ``unreadable_shard`` and recorded in ``unreadable`` (``path -> reason``). The break is at the
    same place on every read, so a resume re-reads exactly the same documents.
    """
    import fsspec

    skipped = Counter() if skipped is None else skipped
    for path in files:
        bad = Counter()
        kept, broken = 0, False
        try:
            with fsspec.open(path, "rt", compression="infer", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        bad["not_json"] += 1
                        continue
                    if not isinstance(row, dict) or "text" not in row:
                        bad["no_text"] += 1
                    elif not isinstance(row["text"], str):
                        bad["text_not_str"] += 1
                    else:
                        kept += 1
                        yield {"text": row["text"]}
        except _UNREADABLE as err:
            reason = f"{type(err).__name__}: {err}"
            log.warning("C4 shard %s breaks after %d document(s) (%s): skipping its rest", path, kept, reason)
            skipped["unreadable_shard"] += 1
            broken = True  # counted once, as unreadable, not also as empty
            if unreadable is not None:
                unreadable[path] = reason
        if bad:
            log.warning("skipped %d malformed line(s) in %s: %s", sum(bad.values()), path, dict(bad))
            skipped.update(bad)
        if kept == 0 and not bad and not broken:
            log.warning("C4 shard %s has no document", path)
            skipped["empty_shard"] += 1


def _c4_split_files(source: str | dict | list | None, path: str, name: str | None) -> dict[str, list[str]]:
    """Resolve the source to ``{split: [file, ...]}`` with ``datasets``' own data-file resolution.

    Raises:
        FileNotFoundError: local files missing or matching nothing.
        RuntimeError: the Hub dataset cannot be reached; the message names the local alternative.
    """
    import datasets

    if source == EMBEDDED:
        source = EMBEDDED_DATA_FILES
    if source is None:
        try:
            builder = datasets.load_dataset_builder(path, name)
        except Exception as err:  # offline, gated, unknown name: all end in the same advice
            raise RuntimeError(
                f"cannot reach the Hub dataset {path!r} (config {name!r}): {type(err).__name__}: {err}. "
                f"Point --data.data_files at a local copy in C4's format instead, e.g. a directory of "
                f"'en/c4-train.*-of-01024.json.gz' and 'en/c4-validation.*' shards, or `data_files: embedded` "
                f"for the bundled corpus."
            ) from err
        resolved = builder.config.data_files
        if not resolved:
            raise RuntimeError(f"the Hub dataset {path!r} (config {name!r}) lists no data files")
        return {split: list(files) for split, files in resolved.items()}
    if isinstance(source, str) and os.path.isdir(source):
        # a C4 mirror: splits by C4's file names, validation optional
        directory, pattern = source, os.path.join(glob.escape(source), "**", "c4-{}.*.json*")
        source = {s: p for s in ("train", "validation") if glob.glob(p := pattern.format(s), recursive=True)}
        if not source:
            raise FileNotFoundError(
                f"no C4 shards (c4-train.*.json[.gz], c4-validation.*) under the directory {directory!r}; "
                f"point --data.data_files at a directory of C4 shards, or use `embedded`"
            )
    try:
        resolved = datasets.load_dataset_builder("json", data_files=source).config.data_files
        empty = [split for split, files in resolved.items() if not files]
        if not resolved or empty:
            raise FileNotFoundError(f"no file for split(s) {empty or ['train']}")
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"C4 data_files {source!r} match no file ({err}); give a directory of C4 shards, a glob, "
            f"a mapping split -> glob, or `embedded` for the bundled corpus"
        ) from err
    return {split: list(files) for split, files in resolved.items()}


# ----------------------------------------------------------------------------- packing
def packed_training_tokens(document_tokens: int, seq_len: int, batch_size: int) -> int:
    """The training tokens one pass over ``document_tokens`` (BOS and EOS included) gives as one stream: windows of
    ``seq_len + 1`` packed end to end (``floor(N / (L + 1))``, the tail dropped), whole batches of them
    (``drop_last``), ``seq_len`` input positions a window. Each further stream (a DataLoader worker or a device)
    drops its own tail and last partial batch: a pass of several streams is a few windows shorter."""
    batches = document_tokens // (seq_len + 1) // batch_size
    return batches * batch_size * seq_len


class PackedWindows(IterableDataset):
    """Token windows ``[seq_len + 1]`` of one rank, split into ``num_streams`` disjoint streams.

    Each DataLoader worker serves one stream (``num_workers=0``: one stream in the main process).
    Items are ``(stream, index, window)``: ``index`` counts the stream's windows from the start of
    the epoch, which is what the resumable loader records. Every window is yielded once per epoch
    over all ranks and streams when the files split evenly (``datasets`` falls back to row striding
    otherwise, which is still disjoint and complete).

    Args:
        files: this split's shard files (all ranks pass the same list).
        tokenizer: ``tokenizer.json`` path, ``"embedded"`` or a Hub name.
        seq_len: model input length ``L``; windows hold ``L + 1`` tokens.
        rank, world_size: this process's data-parallel position.
        shuffle_buffer: ``datasets`` shuffle buffer in documents; 0 keeps file order.
        seed: shuffle seed (file order and buffer); the epoch is added by ``set_epoch``.
    """

    def __init__(
        self,
        files: list[str],
        tokenizer: str,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle_buffer: int = 0,
        seed: int = 42,
    ) -> None:
        self.files, self.tokenizer, self.seq_len = list(files), tokenizer, seq_len
        self.rank, self.world_size, self.shuffle_buffer, self.seed = rank, world_size, shuffle_buffer, seed
        self.epoch = 0
        self.skip: dict[int, int] = {}
        """Windows to skip per stream at the start of the next iteration (restore)."""
        self.first_stream = 0
        """Stream served by worker 0: keeps the round-robin order of batches across a restore."""

    def documents(self, stream: int, num_streams: int) -> Iterable[dict[str, Any]]:
        """The documents of one stream, as a ``datasets.IterableDataset``."""
        import datasets
        from datasets.distributed import split_dataset_by_node

        # A list in gen_kwargs makes one shard per file: ranks and streams split by file.
        ds = datasets.IterableDataset.from_generator(
            read_documents,
            features=datasets.Features({"text": datasets.Value("string")}),
            gen_kwargs={"files": self.files},
        )
        ds = split_dataset_by_node(ds, rank=self.rank, world_size=self.world_size)
        if num_streams > 1:
            if ds.num_shards < num_streams:
                raise ValueError(
                    f"num_workers={num_streams} exceeds the {ds.num_shards} shard file(s) of rank {self.rank}; "
                    f"use num_workers <= {ds.num_shards} (each worker reads whole files)"
                )
            ds = ds.shard(num_shards=num_streams, index=stream, contiguous=False)
        if self.shuffle_buffer > 0:
            ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            ds.set_epoch(self.epoch)
        return ds

    def windows(self, stream: int, num_streams: int) -> Iterator[torch.Tensor]:
        """Pack ``[BOS] doc [EOS]`` token runs into consecutive, non-overlapping ``[L + 1]`` windows."""
        tok = load_tokenizer(self.tokenizer)
        ids = SpecialTokens.from_tokenizer(tok)
        size = self.seq_len + 1
        buffer: list[int] = []
        for batch in self.documents(stream, num_streams).iter(batch_size=_ENCODE_BATCH):
            for enc in tok.encode_batch(batch["text"], add_special_tokens=False):
                buffer.append(ids.bos_id)
                buffer.extend(enc.ids)
                buffer.append(ids.eos_id)
            n = len(buffer) // size
            if n:
                block = torch.tensor(buffer[: n * size], dtype=torch.long).view(n, size)  # [n, L+1]
                del buffer[: n * size]
                yield from block
        # the tail shorter than L + 1 is dropped: no padding in pretraining

    def __iter__(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        info = get_worker_info()
        num_streams = info.num_workers if info is not None else 1
        stream = ((info.id if info is not None else 0) + self.first_stream) % num_streams
        skip = self.skip.get(stream, 0)
        for index, window in enumerate(self.windows(stream, num_streams)):
            if index >= skip:
                yield stream, index, window


def collate_windows(items: list[tuple[int, int, torch.Tensor]]) -> dict[str, Any]:
    """Stack windows [B, L+1] into shifted ``input_ids``/``labels`` [B, L] plus the stream bookkeeping
    (``stream``, ``next_index``) that ``ResumableLoader`` strips before the batch reaches the model."""
    windows = torch.stack([w for _, _, w in items])  # [B, L+1]
    return {
        "input_ids": windows[:, :-1],
        "labels": windows[:, 1:],
        "stream": items[0][0],  # a batch never mixes streams: each worker collates its own items
        "next_index": items[-1][1] + 1,
    }


def collate_fixed_windows(items: list[tuple[int, int, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``collate_windows`` without the stream bookkeeping: for loaders that restart at every pass."""
    batch = collate_windows(items)
    return {"input_ids": batch["input_ids"], "labels": batch["labels"]}


class ResumableLoader(DataLoader):
    """A DataLoader over ``PackedWindows`` whose ``state_dict`` brings back the exact next batch.

    Lightning saves ``state_dict()`` of a stateful train dataloader in every checkpoint and calls
    ``load_state_dict`` before the first ``iter()`` on restore (``fit_loop.setup_data``). The state
    is the epoch, each stream's window count and the stream due next; on restore each worker skips
    its consumed windows (re-reading them, in parallel across workers) and worker 0 starts with the
    stream due next, so the batch order equals the uninterrupted run's. The same ``num_workers``
    and world size are required to resume (checked).

    Args:
        dataset: the rank's windows.
        batch_size: windows per batch.
        num_workers: DataLoader workers, one stream each (0: one stream in the main process).
        lookahead: batches yielded but not yet consumed when ``state_dict`` is called. Lightning's
            training loop prefetches one batch (``_PrefetchDataFetcher``), hence the default 1; use
            0 when iterating the loader directly.
        drop_last: drop each stream's final partial batch (fixed shapes for training).
    """

    def __init__(
        self,
        dataset: PackedWindows,
        batch_size: int,
        num_workers: int = 0,
        lookahead: int = 1,
        drop_last: bool = True,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=collate_windows,
            drop_last=drop_last,
            pin_memory=pin_memory,
        )
        self.lookahead = lookahead
        self._epoch = 0
        self._states: deque[dict[str, Any]] = deque([self._fresh_state(0)], maxlen=lookahead + 1)

    def _streams(self) -> int:
        return max(1, self.num_workers)

    def _fresh_state(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "consumed": {},
            "next_stream": 0,
            "num_streams": self._streams(),
            "world_size": self.dataset.world_size,
        }

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        state = self._states[-1]
        dataset: PackedWindows = self.dataset
        dataset.epoch = state["epoch"]
        dataset.skip = dict(state["consumed"])
        dataset.first_stream = state["next_stream"]
        consumed = dict(state["consumed"])
        # workers copy the dataset when super().__iter__() starts them, so it is configured first
        for batch in super().__iter__():
            stream = batch.pop("stream")
            consumed[stream] = batch.pop("next_index")
            self._states.append({**state, "consumed": dict(consumed), "next_stream": (stream + 1) % self._streams()})
            yield batch
        self._epoch = state["epoch"] + 1
        self._states.clear()
        self._states.append(self._fresh_state(self._epoch))

    def state_dict(self) -> dict[str, Any]:
        """The position after the last consumed batch (yielded minus ``lookahead``)."""
        return dict(self._states[0])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        expected = {"num_streams": self._streams(), "world_size": self.dataset.world_size}
        saved = {k: state_dict.get(k) for k in expected}
        if saved != expected:
            raise ValueError(
                f"cannot resume the C4 stream: the checkpoint was written with {saved}, this run has "
                f"{expected}; resume with the same --data.num_workers and number of devices"
            )
        state = {**state_dict, "consumed": {int(k): int(v) for k, v in state_dict["consumed"].items()}}
        self._states.clear()
        self._states.append(state)


# ----------------------------------------------------------------------------- DataModule
class C4DataModule(LightningDataModule):
    """C4 (``allenai/c4``, config ``en``) streamed with ``datasets`` and packed for pretraining.

    Batches: ``input_ids`` and ``labels`` LongTensors [batch_size, seq_len], ``labels[:, t]`` the
    token after ``input_ids[:, t]``; no padding, so no -100.

    Example (offline, on the embedded corpus):
        >>> dm = C4DataModule.embedded(seq_len=64, batch_size=2)
        >>> dm.setup("fit")
        >>> next(iter(dm.train_dataloader()))["input_ids"].shape
        torch.Size([2, 64])

    Args:
        path: Hub dataset, used when ``data_files`` is None.
        name: Hub dataset config.
        data_files: local C4-format shards instead of the Hub: a directory (split by C4's file names
            ``c4-train.*``/``c4-validation.*``), a glob (train only), a mapping ``split -> glob or
            list``, or ``"embedded"`` for the bundled corpus.
        tokenizer: ``tokenizer.json`` path, a Hub name, or ``"embedded"``.
        seq_len: tokens per input row ``L`` (windows hold ``L + 1`` tokens).
        batch_size: windows per batch, per device.
        num_workers: DataLoader workers per device; each reads whole shard files.
        shuffle_buffer: documents in the streaming shuffle buffer (0 keeps file order).
        seed: shuffle seed; the epoch is added to it each epoch.
        train_split: split name of the training shards.
        val_split: split name of the validation shards; None (or absent from the source) for no validation.
    """

    def __init__(
        self,
        path: str = "allenai/c4",
        name: str | None = "en",
        data_files: str | dict[str, str | list[str]] | None = None,
        tokenizer: str = HUB_TOKENIZER,
        seq_len: int = 1024,
        batch_size: int = 8,
        num_workers: int = 0,
        shuffle_buffer: int = 1000,
        seed: int = 42,
        train_split: str = "train",
        val_split: str | None = "validation",
    ) -> None:
        super().__init__()
        problems = [
            f"{field} must be a positive int, got {value!r}"
            for field, value in (("seq_len", seq_len), ("batch_size", batch_size))
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0
        ]
        problems += [
            f"{field} must be an int >= 0, got {value!r}"
            for field, value in (("num_workers", num_workers), ("shuffle_buffer", shuffle_buffer))
            if not isinstance(value, int) or isinstance(value, bool) or value < 0
        ]
        raise_if_problems("C4DataModule arguments", problems)
        self.save_hyperparameters()
        self.path, self.name, self.data_files, self.tokenizer = path, name, data_files, tokenizer
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.shuffle_buffer, self.seed, self.train_split, self.val_split = shuffle_buffer, seed, train_split, val_split
        self.files: dict[str, list[str]] = {}
        self.special_tokens: SpecialTokens | None = None

    @classmethod
    def embedded(cls, **kwargs: Any) -> C4DataModule:
        """The bundled corpus and tokenizer (what ``recipes/tiny.yaml`` trains on, offline)."""
        return cls(**{"data_files": EMBEDDED, "tokenizer": EMBEDDED, "seq_len": 256, **kwargs})

    def run_facts(self) -> dict[str, Any]:
        """What this data module tells the model about the run (``bhyt_pl.run_config.RunFactsSource``): every
        registered run fact of its sequence length and per-device batch size (``bhyt_pl.run_facts``); a norm
        scheme binds those it declares."""
        return build_run_facts(seq_len=self.seq_len, batch_size=self.batch_size)

    def training_tokens_per_epoch(self) -> int | None:
        """The training tokens one pass over the training split gives at this ``seq_len`` and ``batch_size`` (one
        stream: ``packed_training_tokens``): known for the embedded corpus and tokenizer (``EMBEDDED_TRAIN_TOKENS``),
        None for any other source, which would have to be tokenized whole to count."""
        if self.data_files != EMBEDDED or self.tokenizer != EMBEDDED or self.train_split != "train":
            return None
        return packed_training_tokens(EMBEDDED_TRAIN_TOKENS, self.seq_len, self.batch_size)

    def prepare_data(self) -> None:
        load_tokenizer(self.tokenizer)  # fetch (and cache) a Hub tokenizer once, on rank 0

    def setup(self, stage: str | None = None) -> None:
        self.special_tokens = SpecialTokens.from_tokenizer(load_tokenizer(self.tokenizer))
        files = _c4_split_files(self.data_files, self.path, self.name)
        source = self.data_files if self.data_files is not None else f"{self.path}/{self.name}"
        if self.train_split not in files:
            raise ValueError(f"C4 source {source!r} has no {self.train_split!r} split; splits: {sorted(files)}")
        # an empty or unreadable source fails here, not after the first steps: read until one valid document
        unreadable: dict[str, str] = {}
        if next(read_documents(files[self.train_split], unreadable=unreadable), None) is None:
            if len(unreadable) == len(files[self.train_split]):
                listed = "\n  - ".join(f"{path}: {reason}" for path, reason in unreadable.items())
                raise UsageError(
                    f"C4 source {source!r} split {self.train_split!r}: no shard is readable:\n  - {listed}\n"
                    f"re-download or replace these files, or point --data.data_files elsewhere"
                )
            raise UsageError(
                f"C4 source {source!r} split {self.train_split!r} has no document with a string 'text' "
                f"in {len(files[self.train_split])} file(s); check the files or point --data.data_files elsewhere"
            )
        if self.val_split is not None and self.val_split not in files:
            log.info("C4 source %r has no %r split: no validation", source, self.val_split)
        self.files = files
        if self._has_eval_split():
            for eval_stage in eval_stages(stage):
                self._require_eval_windows(eval_set(self.trainer, eval_stage, self.batch_size))

    def _has_eval_split(self) -> bool:
        return self.val_split is not None and self.val_split in self.files

    def _require_eval_windows(self, share: EvalSet) -> None:
        """Before any step: fail in one line when the split has fewer windows than ranks (read that far only)."""
        if share.size == 0 or share.world_size == 1:
            return
        windows = PackedWindows(self.files[self.val_split], self.tokenizer, self.seq_len).windows(0, 1)
        count = sum(1 for _ in islice(windows, share.world_size))
        share.require(
            count,
            f"C4 split {self.val_split!r} has {count} window{'' if count == 1 else 's'} of {self.seq_len + 1} tokens",
            "give it more documents (--data.init_args.data_files), a shorter --data.init_args.seq_len or fewer "
            "devices, or no validation (--data.init_args.val_split null)",
        )

    def _windows(self, split: str, shuffle_buffer: int) -> PackedWindows:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        return PackedWindows(
            self.files[split], self.tokenizer, self.seq_len, rank, world, shuffle_buffer=shuffle_buffer, seed=self.seed
        )

    def train_dataloader(self) -> ResumableLoader:
        return ResumableLoader(
            self._windows(self.train_split, self.shuffle_buffer), self.batch_size, num_workers=self.num_workers
        )

    def _eval_loader(self, stage: str) -> DataLoader | list:
        """The evaluation set (``bhyt_pl.data.eval_set``) of the validation split's windows in file order, no
        shuffle: the first K windows, window i on rank i mod W, so every rank gets the same number of batches
        and every pass (the sanity check included) the same ones; ``val/loss`` moves only with the weights and
        a resumed run validates on what the uninterrupted one does. Every rank reads the stream from its start
        up to K windows, in the main process or one DataLoader worker (a plain ``DataLoader`` over an iterable
        dataset restarts at each ``iter()``)."""
        if not self._has_eval_split():
            return []
        share = eval_set(self.trainer, stage, self.batch_size)
        windows = PackedWindows(self.files[self.val_split], self.tokenizer, self.seq_len)  # every file, one stream
        return DataLoader(
            SharedStream(windows, share),
            batch_size=self.batch_size,
            num_workers=min(self.num_workers, 1),
            collate_fn=collate_fixed_windows,
        )

    def val_dataloader(self) -> DataLoader | list:
        """The validation set: the first ``trainer.limit_val_batches`` x ``batch_size`` windows of the split."""
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader | list:
        """C4 has no labelled test split: ``test`` reads the validation split (``limit_test_batches``)."""
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader | list:
        """``predict`` scores the validation windows (per-sequence NLL, see ``LlamaLM.predict_step``) of the
        first ``limit_predict_batches`` x ``batch_size``."""
        return self._eval_loader("predict")

from __future__ import annotations

import json
import logging
import re
import zlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from bhyt_pl.data import C4DataModule, PackedWindows, ResumableLoader, load_tokenizer, read_documents
from bhyt_pl.data.c4 import EMBEDDED_DATA_FILES, EMBEDDED_TRAIN_TOKENS, packed_training_tokens
from bhyt_pl.errors import AgreedUsageError, UsageError

from .conftest import c4_row, word_docs, write_shard

BOS, EOS = 0, 1  # the embedded tokenizer's ids, checked in test_tokenizer.py


def reference_windows(docs: list[str], seq_len: int) -> list[list[int]]:
    """Packing written out plainly: [BOS] doc [EOS] ... cut into consecutive seq_len + 1 windows."""
    tok = load_tokenizer("embedded")
    stream = []
    for doc in docs:
        stream += [BOS] + tok.encode(doc, add_special_tokens=False).ids + [EOS]
    size = seq_len + 1
    return [stream[i : i + size] for i in range(0, len(stream) - size + 1, size)]


def shard_files(c4_dir: Path) -> list[str]:
    return sorted(str(p) for p in c4_dir.glob("en/c4-train.*"))


def test_batches_are_shifted_packed_windows(c4_dir: Path):
    dm = C4DataModule(data_files=str(c4_dir), tokenizer="embedded", seq_len=16, batch_size=3, shuffle_buffer=0)
    dm.setup("fit")
    assert [Path(f).name for f in dm.files["train"]] == [Path(f).name for f in shard_files(c4_dir)]
    assert len(dm.files["validation"]) == 1
    loader = dm.train_dataloader()
    batches = list(loader)
    expected = reference_windows([d for i in range(4) for d in word_docs(i, 12)], 16)
    got = [row for b in batches for row in torch.cat([b["input_ids"][:, :1], b["labels"]], 1).tolist()]
    assert got == expected[: len(got)] and len(expected) - len(got) < 3  # drop_last: under one batch lost
    assert all(b["input_ids"].shape == (3, 16) and b["input_ids"].dtype == torch.long for b in batches)
    assert torch.equal(batches[0]["input_ids"][:, 1:], batches[0]["labels"][:, :-1])
    assert set(batches[0]) == {"input_ids", "labels"}
    val = list(dm.val_dataloader())
    assert torch.cat([torch.cat([b["input_ids"][:, :1], b["labels"]], 1) for b in val]).tolist() == reference_windows(
        word_docs(9, 6), 16
    )


@pytest.mark.slow  # two DataLoader worker processes per rank
def test_two_ranks_two_workers_are_disjoint_and_complete(c4_dir: Path):
    files = shard_files(c4_dir)
    seen_shards = []
    for rank in range(2):
        ds = PackedWindows(files, "embedded", seq_len=8, rank=rank, world_size=2, shuffle_buffer=0)
        items = list(DataLoader(ds, batch_size=None, num_workers=2))
        tok = load_tokenizer("embedded")
        for stream in range(2):
            windows = [w.tolist() for s, _, w in items if s == stream]
            shards = {s for w in windows for s in re.findall(r"\bs(\d)d\d+w\d", tok.decode(w))}
            assert len(shards) == 1, f"rank {rank} stream {stream} read shards {shards}: one file each expected"
            (shard,) = shards
            assert windows == reference_windows(word_docs(int(shard), 12), 8)
            seen_shards.append(int(shard))
    assert sorted(seen_shards) == [0, 1, 2, 3]


def _rank_trainer(rank: int, world: int, limit: int | float) -> SimpleNamespace:
    """What the data module reads of a Trainer: its data-parallel position and the evaluation limits."""
    position = {"rank": rank, "num_replicas": world}
    return SimpleNamespace(global_rank=rank, world_size=world, distributed_sampler_kwargs=position,
                           limit_val_batches=limit, limit_test_batches=limit, limit_predict_batches=limit)  # fmt: skip


def _rows(batches: list[dict]) -> list[list[int]]:
    return [r for b in batches for r in torch.cat([b["input_ids"][:, :1], b["labels"]], 1).tolist()]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_ranks_validate_on_equal_shares_of_the_first_windows_at_every_pass(c4_dir: Path, num_workers: int):
    """Each rank read its own validation file: ranks got different numbers of batches (a FSDP2 forward then hung
    in the pass) and ``limit_val_batches`` counted per rank. Now the validation set is the first
    ``limit_val_batches`` x ``batch_size`` windows of the split in file order, window i on rank i mod 2, the same
    batches at every pass; ``test`` and ``predict`` read it the same way under their own limits."""
    write_shard(c4_dir / "en" / "c4-validation.00001-of-00001.json.gz", [c4_row(t) for t in word_docs(8, 6)])
    one_process = reference_windows(word_docs(9, 6) + word_docs(8, 6), 8)  # the files in order, one stream
    assert len(one_process) >= 12

    def loaders(limit: int | float, world: int) -> list[dict[str, DataLoader]]:
        result = []
        for rank in range(world):
            dm = C4DataModule(data_files=str(c4_dir), tokenizer="embedded", seq_len=8, batch_size=2,
                              num_workers=num_workers, shuffle_buffer=4)  # fmt: skip
            dm.trainer = _rank_trainer(rank, world, limit)
            dm.setup("fit")
            result.append(
                {"val": dm.val_dataloader(), "test": dm.test_dataloader(), "predict": dm.predict_dataloader()}
            )
        return result

    for limit, first in ((3, 6), (1.0, len(one_process) // 2 * 2)):  # 3 batches of 2 windows; the whole split
        ranks = loaders(limit, 2)
        for name in ("val", "test", "predict"):
            passes = [[list(rank[name]) for rank in ranks] for _ in range(2)]
            assert [_rows(b) for b in passes[0]] == [_rows(b) for b in passes[1]]  # the same at every pass
            zero, one = passes[0]
            assert len(zero) == len(one)  # the same number of batches on each rank
            assert _rows(zero) == one_process[0:first:2] and _rows(one) == one_process[1:first:2]
    (single,) = loaders(3, 1)
    assert _rows(list(single["val"])) == one_process[:6]  # one process: 3 batches of 2, the same 6 windows


def test_a_validation_split_with_fewer_windows_than_ranks_fails_at_setup(tmp_path: Path):
    write_shard(tmp_path / "c4-train.00000-of-00001.json.gz", [c4_row(t) for t in word_docs(0, 12)])
    write_shard(tmp_path / "c4-validation.00000-of-00001.json.gz", [c4_row(word_docs(9, 1)[0])])
    assert len(reference_windows(word_docs(9, 1), 16)) == 1
    dm = C4DataModule(data_files=str(tmp_path), tokenizer="embedded", seq_len=16, batch_size=2)
    dm.trainer = _rank_trainer(0, 2, 8)
    with pytest.raises(UsageError) as err:
        dm.setup("fit")
    assert str(err.value).startswith(
        "C4 split 'validation' has 1 window of 17 tokens for 2 ranks; every rank needs at least one: give it more "
    )
    assert "\n" not in str(err.value) and isinstance(err.value, AgreedUsageError)
    dm.trainer = _rank_trainer(0, 2, 0)  # no validation: nothing to require
    dm.setup("fit")
    dm.trainer = _rank_trainer(0, 1, 8)  # one rank: one window is enough
    dm.setup("validate")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_from_state_dict_gives_the_uninterrupted_next_batches(c4_dir: Path, num_workers: int):
    def loader() -> ResumableLoader:
        ds = PackedWindows(shard_files(c4_dir), "embedded", seq_len=8, shuffle_buffer=8, seed=3)
        return ResumableLoader(ds, batch_size=2, num_workers=num_workers, lookahead=0)

    for k in (3, 4):  # with two workers: resume on either worker's turn
        first = loader()
        it = iter(first)
        [next(it) for _ in range(k)]
        state = first.state_dict()
        uninterrupted = [next(it) for _ in range(3)]
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        it = iter(resumed)
        for expected in uninterrupted:
            got = next(it)
            assert torch.equal(got["input_ids"], expected["input_ids"]) and torch.equal(
                got["labels"], expected["labels"]
            )
        del it


def test_shuffle_changes_order_but_not_content_and_follows_the_epoch(c4_dir: Path):
    def windows(buffer: int, epoch: int = 0) -> list[list[int]]:
        ds = PackedWindows(shard_files(c4_dir), "embedded", seq_len=8, shuffle_buffer=buffer, seed=1)
        ds.epoch = epoch
        return [w.tolist() for _, _, w in ds]

    plain, shuffled, again, other_epoch = windows(0), windows(8), windows(8), windows(8, epoch=1)
    assert shuffled == again and shuffled != plain and other_epoch != shuffled
    tokens = Counter(t for w in plain for t in w)
    assert abs(sum(tokens.values()) - sum(t for w in shuffled for t in [len(w)])) < 4 * 9  # same corpus, tails aside


def test_resume_mismatched_workers_is_refused(c4_dir: Path):
    ds = PackedWindows(shard_files(c4_dir), "embedded", seq_len=8)
    state = ResumableLoader(ds, batch_size=2, num_workers=2).state_dict()
    with pytest.raises(ValueError, match="resume with the same --data.num_workers"):
        ResumableLoader(ds, batch_size=2, num_workers=0).load_state_dict(state)


class _Recorder(LightningModule):
    """The smallest module taking ``input_ids``/``labels`` batches; records what it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8192, 8)
        self.out = torch.nn.Linear(8, 8192)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"].clone())
        logits = self.out(self.emb(batch["input_ids"]))  # [B, T, V]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.slow
def test_trainer_checkpoint_resumes_on_the_exact_next_batch(c4_dir: Path, tmp_path: Path):
    def fit(max_steps: int, ckpt_path=None, callbacks=()) -> list[torch.Tensor]:
        dm = C4DataModule(data_files=str(c4_dir), tokenizer="embedded", seq_len=8, batch_size=2, num_workers=2)
        module = _Recorder()
        trainer = Trainer(
            max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, limit_val_batches=0, callbacks=list(callbacks), default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
        return module.seen

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    uninterrupted = fit(7, callbacks=[checkpoint])
    resumed = fit(7, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=3.ckpt")
    assert len(uninterrupted) == 7 and len(resumed) == 4
    for got, expected in zip(resumed, uninterrupted[3:]):
        assert torch.equal(got, expected)


def test_malformed_lines_are_skipped_counted_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    good = word_docs(0, 3)
    lines = [c4_row(good[0]), "{not json", '{"url": "u"}', c4_row(good[1]), c4_row(5), "[1, 2]", c4_row(good[2])]
    shard = write_shard(tmp_path / "c4-train.00000-of-00001.json.gz", lines)
    skipped = Counter()
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.c4"):
        docs = [d["text"] for d in read_documents([str(shard)], skipped)]
    assert docs == good
    assert skipped == Counter(not_json=1, no_text=2, text_not_str=1)
    assert "skipped 4 malformed line(s)" in caplog.text
    ds = PackedWindows([str(shard)], "embedded", seq_len=4)
    assert [w.tolist() for _, _, w in ds] == reference_windows(good, 4)


def test_an_empty_shard_is_reported_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """It was read as zero documents without a word."""
    empty = write_shard(tmp_path / "c4-train.00000-of-00002.json.gz", [])
    full = write_shard(tmp_path / "c4-train.00001-of-00002.json.gz", [c4_row(t) for t in word_docs(0, 2)])
    skipped = Counter()
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.c4"):
        assert len(list(read_documents([str(empty), str(full)], skipped))) == 2
    assert skipped == Counter(empty_shard=1) and f"C4 shard {empty} has no document" in caplog.text


def test_empty_source_fails_at_setup(tmp_path: Path):
    write_shard(tmp_path / "c4-train.00000-of-00001.json.gz", ["{bad", '{"text": null}'])
    dm = C4DataModule(data_files=str(tmp_path), tokenizer="embedded")
    with pytest.raises(ValueError, match=r"split 'train' has no document with a string 'text' in 1 file"):
        dm.setup("fit")


def test_missing_local_path_fails_at_setup(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"C4 data_files .*nowhere.* match no file.*`embedded`"):
        C4DataModule(data_files=str(tmp_path / "nowhere" / "*.json.gz"), tokenizer="embedded").setup("fit")
    with pytest.raises(FileNotFoundError, match="no C4 shards .* under the directory"):
        C4DataModule(data_files=str(tmp_path), tokenizer="embedded").setup("fit")


def test_unreachable_hub_dataset_names_the_local_alternative():
    with pytest.raises(RuntimeError, match=r"cannot reach the Hub dataset 'allenai/c4' \(config 'en'\).*data_files"):
        C4DataModule(tokenizer="embedded").setup("fit")


def test_invalid_arguments_are_collected():
    with pytest.raises(ValueError, match=r"seq_len must be a positive int, got 0\n  - num_workers must be an int >= 0"):
        C4DataModule(seq_len=0, num_workers=-1)


def test_embedded_default_trains_offline():
    dm = C4DataModule.embedded(batch_size=2)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (2, 256) and int(batch["input_ids"].max()) < 8192
    assert dm.special_tokens.bos_id == BOS


def _truncated_shard(path: Path, docs: list[str], keep: float) -> Path:
    """A gzip shard cut after ``keep`` of its bytes, as an interrupted download leaves it."""
    write_shard(path, [c4_row(t) for t in docs])
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _complete_docs_in_prefix(path: Path) -> list[str]:
    """Independent reference: decompress what the truncated file holds and parse its complete lines."""
    text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(path.read_bytes()).decode("utf-8", errors="replace")
    return [json.loads(line)["text"] for line in text.split("\n")[:-1]]  # the last piece is cut mid-line


def test_a_truncated_shard_keeps_its_documents_and_skips_its_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A gzip shard cut short yields the documents before the cut and is logged by name; it raises no EOFError,
    mid-training or at once on resume."""
    docs = word_docs(0, 3000)
    broken = _truncated_shard(tmp_path / "c4-train.00000-of-00002.json.gz", docs, keep=0.6)
    good_docs = word_docs(1, 20)
    good = write_shard(tmp_path / "c4-train.00001-of-00002.json.gz", [c4_row(t) for t in good_docs])
    skipped, unreadable = Counter(), {}
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.c4"):
        read = [d["text"] for d in read_documents([str(broken), str(good)], skipped, unreadable)]
    prefix = _complete_docs_in_prefix(broken)
    kept = read[: len(read) - len(good_docs)]
    assert 0 < len(kept) <= len(prefix) < len(docs) and kept == docs[: len(kept)]
    assert len(prefix) - len(kept) < 400  # at most one read buffer of documents is lost at the break
    assert read[len(kept) :] == good_docs  # the next shard is read whole
    assert skipped == Counter(unreadable_shard=1) and list(unreadable) == [str(broken)]
    assert "EOFError" in unreadable[str(broken)]
    assert f"C4 shard {broken} breaks after {len(kept)} document(s)" in caplog.text


def test_training_data_with_a_broken_shard_resumes_on_the_exact_next_batch(tmp_path: Path):
    files = [
        str(_truncated_shard(tmp_path / "c4-train.00000-of-00002.json.gz", word_docs(0, 3000), keep=0.3)),
        str(write_shard(tmp_path / "c4-train.00001-of-00002.json.gz", [c4_row(t) for t in word_docs(1, 40)])),
    ]

    def loader() -> ResumableLoader:
        return ResumableLoader(PackedWindows(files, "embedded", seq_len=64), batch_size=4, lookahead=0)

    all_batches = [b["input_ids"] for b in loader()]
    assert len(all_batches) > 10  # the stream goes past the break into the second shard
    first = loader()
    it = iter(first)
    for _ in range(len(all_batches) - 3):
        next(it)
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert all(torch.equal(a["input_ids"], b) for a, b in zip(resumed, all_batches[-3:], strict=True))


def test_a_shard_breaking_before_its_first_document_is_counted_once(tmp_path: Path):
    """It counts as unreadable only, also when the caller keeps no ``unreadable`` record."""
    broken = _truncated_shard(tmp_path / "c4-train.00000-of-00001.json.gz", word_docs(0, 3000), keep=0.002)
    skipped = Counter()
    assert list(read_documents([str(broken)], skipped)) == []
    assert skipped == Counter(unreadable_shard=1)


def test_setup_fails_naming_every_unreadable_shard(tmp_path: Path):
    cut = _truncated_shard(tmp_path / "c4-train.00000-of-00002.json.gz", word_docs(0, 50), keep=0.05)
    garbage = tmp_path / "c4-train.00001-of-00002.json.gz"
    garbage.write_bytes(b"<html>Not Found</html>" * 10)  # an error page saved under the shard's name
    dm = C4DataModule(data_files=str(tmp_path), tokenizer="embedded")
    with pytest.raises(UsageError, match=r"no shard is readable") as err:
        dm.setup("fit")
    assert f"{cut}: EOFError" in str(err.value) and f"{garbage}: BadGzipFile" in str(err.value)


def test_embedded_train_tokens_is_the_split_counted_again():
    """The constant against a count of its own: every train document tokenized, plus its BOS and EOS."""
    tok = load_tokenizer("embedded")
    docs = [d["text"] for d in read_documents(EMBEDDED_DATA_FILES["train"])]
    assert len(docs) == 1159  # assets/README.md
    assert sum(len(e.ids) + 2 for e in tok.encode_batch(docs, add_special_tokens=False)) == EMBEDDED_TRAIN_TOKENS


def test_packed_training_tokens_is_one_pass_of_the_loader(c4_dir: Path):
    docs = [d for i in range(4) for d in word_docs(i, 12)]
    tok = load_tokenizer("embedded")
    document_tokens = sum(len(tok.encode(d, add_special_tokens=False).ids) + 2 for d in docs)
    dm = C4DataModule(data_files=str(c4_dir), tokenizer="embedded", seq_len=8, batch_size=3, shuffle_buffer=4)
    dm.setup("fit")
    seen = sum(b["input_ids"].numel() for b in dm.train_dataloader())
    assert seen > 0
    assert seen == packed_training_tokens(document_tokens, 8, 3) == (document_tokens // 9 // 3) * 3 * 8
    # the study's shapes on the embedded corpus: 948,868 // 65 = 14,597 windows, 1,824 batches of 8 x 64
    assert packed_training_tokens(948_868, 64, 8) == 1824 * 512 == 933_888


def test_only_the_embedded_corpus_knows_its_size(c4_dir: Path):
    assert C4DataModule.embedded(seq_len=64, batch_size=8).training_tokens_per_epoch() == 933_888
    assert C4DataModule.embedded(seq_len=256, batch_size=8).training_tokens_per_epoch() == 3692 // 8 * 8 * 256
    assert C4DataModule(data_files=str(c4_dir), tokenizer="embedded").training_tokens_per_epoch() is None
    assert C4DataModule(data_files="embedded", tokenizer="other.json").training_tokens_per_epoch() is None

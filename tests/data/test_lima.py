from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bhyt_pl.data import LIMADataModule, encode_conversation, load_tokenizer, parse_row
from bhyt_pl.errors import UsageError

from .conftest import FIXTURES

BOS, PAD, START, END, EOT = 0, 2, 3, 4, 5  # embedded tokenizer ids (test_tokenizer.py checks them)
IGNORE = -100


def enc(text: str) -> list[int]:
    return load_tokenizer("embedded").encode(text, add_special_tokens=False).ids


def turn(role: str, content: str) -> tuple[list[int], list[int]]:
    """(header ids, content + <|eot_id|> ids) of one Llama-3 turn, written out by hand."""
    return [START, *enc(role), END, *enc("\n\n")], [*enc(content), EOT]


def shifted(ids: list[int], supervised: list[bool]) -> tuple[list[int], list[int]]:
    return ids[:-1], [t if s else IGNORE for t, s in zip(ids[1:], supervised[1:])]


def test_only_the_assistant_turn_is_supervised():
    tok = load_tokenizer("embedded")
    (uh, uc), (ah, ac) = turn("user", "Who made the sea?"), turn("assistant", "God made the sea.")
    ids = [BOS, *uh, *uc, *ah, *ac]
    n_prompt = 1 + len(uh) + len(uc) + len(ah)
    input_ids, labels = encode_conversation(tok, ["Who made the sea?", "God made the sea."])
    assert input_ids == ids[:-1]
    assert labels == [IGNORE] * (n_prompt - 1) + ac  # target of the last prompt position is the first answer token
    unmasked_ids, unmasked = encode_conversation(tok, ["Who made the sea?", "God made the sea."], mask_prompt=False)
    assert unmasked_ids == input_ids and unmasked == ids[1:]


def test_multi_turn_supervises_every_assistant_turn():
    tok = load_tokenizer("embedded")
    turns = ["Name a colour.", "Red.", "Another?", "Blue."]
    pieces = [turn("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns)]
    ids, sup = [BOS], [False]
    for i, (header, content) in enumerate(pieces):
        ids += header + content
        sup += [False] * len(header) + [i % 2 == 1] * len(content)
    assert encode_conversation(tok, turns) == shifted(ids, sup)
    _, labels = encode_conversation(tok, turns)
    assert labels.count(EOT) == 2  # each assistant turn learns to stop


def test_truncation_keeps_the_prompt_tail_and_the_response_start():
    tok = load_tokenizer("embedded")
    prompt = " ".join(f"p{i}" for i in range(200))
    response = " ".join(f"r{i}" for i in range(200))
    (uh, uc), (ah, ac) = turn("user", prompt), turn("assistant", response)
    body, max_seq_len = uh + uc + ah, 64
    budget = max_seq_len + 1 - 1  # BOS kept
    keep_response = budget // 2  # both sides long: the response gets half
    ids = [BOS, *body[len(body) - (budget - keep_response) :], *ac[:keep_response]]
    sup = [False] * (1 + budget - keep_response) + [True] * keep_response
    input_ids, labels = encode_conversation(tok, [prompt, response], max_seq_len=max_seq_len)
    assert len(input_ids) == len(labels) == max_seq_len
    assert (input_ids, labels) == shifted(ids, sup)
    first_answer = max_seq_len - (keep_response - 1)  # input_ids drops the last kept token
    assert tok.decode(input_ids[first_answer - 8 : first_answer]).endswith("assistant\n\n")  # header survives
    # a short prompt is kept whole and only the response is cut
    short_ids, _ = encode_conversation(tok, ["Hi.", response], max_seq_len=max_seq_len)
    (uh, uc), (ah, _) = turn("user", "Hi."), turn("assistant", response)
    assert short_ids[: 1 + len(uh + uc + ah)] == [BOS, *uh, *uc, *ah] and len(short_ids) == max_seq_len


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"conversations": ["only a prompt"], "source": "x"}, "odd_length"),
        ({"conversations": [], "source": "x"}, "odd_length"),
        ({"conversations": ["q", " "], "source": "x"}, "empty_turn"),
        ({"conversations": ["q", 3], "source": "x"}, "not_strings"),
        ({"text": "neither format"}, "unknown_format"),
        ({"conversations": None, "source": "x"}, "missing_field"),  # LIMA's format with a field missing
    ],
)
def test_malformed_rows_name_their_reason(row, reason):
    assert parse_row(row) == reason


def test_alpaca_rows_join_instruction_and_input():
    assert parse_row({"instruction": "Translate.", "input": "Hi", "output": "Salut"}) == ["Translate.\n\nHi", "Salut"]
    assert parse_row({"instruction": "Say hi.", "input": "", "output": "Hi"}) == ["Say hi.", "Hi"]


def test_lima_jsonl_fixture_loads_skips_and_counts(caplog: pytest.LogCaptureFixture):
    dm = LIMADataModule(data_files=str(FIXTURES / "lima_tiny.jsonl"), tokenizer="embedded", val_split_fraction=0.25)
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.lima"):
        dm.setup("fit")
    assert dict(dm.skipped) == {"odd_length": 1, "empty_turn": 1}
    assert "skipped 2 malformed conversation(s)" in caplog.text
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (6, 2)
    again = LIMADataModule(data_files=str(FIXTURES / "lima_tiny.jsonl"), tokenizer="embedded", val_split_fraction=0.25)
    again.setup("fit")
    assert again.val_dataset.examples == dm.val_dataset.examples  # the split follows the seed
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "labels"} and batch["input_ids"].shape == batch["labels"].shape
    assert batch["input_ids"].shape[1] <= max(len(ids) for ids, _ in dm.train_dataset.examples)


def _rank_trainer(rank: int, world: int, limit: int | float) -> SimpleNamespace:
    """What the data module reads of a Trainer: its data-parallel position and the evaluation limits."""
    position = {"rank": rank, "num_replicas": world}
    return SimpleNamespace(distributed_sampler_kwargs=position, limit_val_batches=limit, limit_test_batches=limit,
                           limit_predict_batches=limit)  # fmt: skip


def test_ranks_evaluate_equal_shares_of_the_first_held_out_conversations():
    """Lightning's sampler padded the last ranks with repeated conversations and ``limit_val_batches`` counted per
    rank: ``val/loss`` changed with the number of processes. Now the first ``limit`` x ``batch_size`` held-out
    conversations, conversation i on rank i mod 2, for validation, test and predict."""
    data = str(FIXTURES / "lima_tiny.jsonl")
    one = LIMADataModule(data_files=data, tokenizer="embedded", batch_size=2, val_split_fraction=0.75)
    one.setup("validate")
    held_out = [ids for ids, _ in one.val_dataset.examples]
    assert len(held_out) == 6
    for limit, first in ((2, 4), (1.0, 6)):
        shares = []
        for rank in range(2):
            dm = LIMADataModule(data_files=data, tokenizer="embedded", batch_size=2, val_split_fraction=0.75)
            dm.trainer = _rank_trainer(rank, 2, limit)
            dm.setup("fit")
            loaders = (dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader())
            shares.append([[[t for t in row if t != PAD] for b in loader for row in b["input_ids"].tolist()]
                           for loader in loaders])  # fmt: skip
        for zero, one_ in zip(*shares):
            assert zero == held_out[0:first:2] and one_ == held_out[1:first:2]


def test_a_held_out_split_smaller_than_the_ranks_fails_at_setup():
    dm = LIMADataModule(data_files=str(FIXTURES / "lima_tiny.jsonl"), tokenizer="embedded", val_split_fraction=0.1)
    dm.trainer = _rank_trainer(1, 2, 4)
    with pytest.raises(UsageError) as err:
        dm.setup("test")
    assert str(err.value) == (
        "LIMA validation split has 1 conversation(s) (val_split_fraction=0.1) for 2 ranks; every rank needs at least "
        "one: raise --data.init_args.val_split_fraction or use fewer devices"
    )
    dm.trainer = _rank_trainer(1, 2, 0)  # no test: nothing to require
    dm.setup("test")


def test_right_padding_uses_pad_id_and_ignores_padded_labels():
    dm = LIMADataModule(data_files=str(FIXTURES / "lima_tiny.jsonl"), tokenizer="embedded", val_split_fraction=0.0)
    dm.setup("fit")
    items = [dm.train_dataset[i] for i in range(len(dm.train_dataset))]
    batch = dm.train_dataloader().collate_fn(items)
    for row, item in enumerate(items):
        n = item["input_ids"].numel()
        assert torch.equal(batch["input_ids"][row, :n], item["input_ids"])
        assert torch.equal(batch["labels"][row, :n], item["labels"])
        assert (batch["input_ids"][row, n:] == PAD).all() and (batch["labels"][row, n:] == IGNORE).all()


def test_alpaca_json_file_loads(tmp_path: Path):
    dm = LIMADataModule(data_files=str(FIXTURES / "lima_alpaca.json"), tokenizer="embedded", val_split_fraction=0.0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 3 and not dm.skipped
    rows = json.loads((FIXTURES / "lima_alpaca.json").read_text())
    expected = {tuple(encode_conversation(load_tokenizer("embedded"), parse_row(r))[0]) for r in rows}
    assert {tuple(ids) for ids, _ in dm.train_dataset.examples} == expected
    assert dm.val_dataloader() == []


def test_gated_hub_dataset_says_how_to_authenticate():
    with pytest.raises(RuntimeError, match=r"'GAIR/lima'.*gated.*hf auth login.*--data.data_files"):
        LIMADataModule(tokenizer="embedded").setup("fit")


def test_missing_local_file_and_bad_arguments(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="LIMA data_files .* match no file"):
        LIMADataModule(data_files=str(tmp_path / "none.jsonl"), tokenizer="embedded").setup("fit")
    with pytest.raises(ValueError, match=r"max_seq_len must be a positive int, got 0\n  - val_split_fraction"):
        LIMADataModule(max_seq_len=0, val_split_fraction=1.0)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"instruction": None, "input": "text", "output": "answer"}, "missing_field"),  # not trained as "None\n\ntext"
        ({"input": "text", "output": "answer"}, "missing_field"),
        ({"instruction": "Do it.", "input": "", "output": None}, "missing_field"),
        ({"instruction": 3, "input": "", "output": "answer"}, "not_strings"),
        ({"instruction": "Do it.", "input": ["a"], "output": "answer"}, "not_strings"),
        ({"instruction": "Do it.", "output": {"text": "answer"}}, "not_strings"),
        ({"instruction": "  ", "input": "text", "output": "answer"}, "empty_turn"),
        ({"conversations": "q and a", "source": "x"}, "not_strings"),
    ],
)
def test_alpaca_and_lima_rows_with_missing_or_mistyped_fields_are_skipped(row, reason):
    assert parse_row(row) == reason


def test_rows_with_missing_fields_are_counted_at_setup(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    rows = [
        {"instruction": "Say hi.", "input": "", "output": "Hi"},
        {"instruction": None, "input": "some text", "output": "answer"},
        {"instruction": "Translate.", "input": "Bonjour", "output": None},
        {"instruction": "Translate.", "input": "Hola", "output": "Hello"},
    ]
    path = tmp_path / "alpaca.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = LIMADataModule(data_files=str(path), tokenizer="embedded", val_split_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.lima"):
        dm.setup("fit")
    assert dict(dm.skipped) == {"missing_field": 2}
    assert len(dm.train_dataset) == 2
    tok = load_tokenizer("embedded")
    prompts = {tok.decode(ex[0]) for ex in dm.train_dataset.examples}
    assert not any("None" in p for p in prompts)
    assert "skipped 2 malformed conversation(s)" in caplog.text


def test_conversations_longer_than_max_seq_len_are_counted_as_truncated(tmp_path: Path, caplog) -> None:
    """They were cut silently."""
    long_answer = " ".join(f"word{i}" for i in range(200))
    rows = [{"conversations": ["Hi?", "Hello."]}, {"conversations": ["Tell me more.", long_answer]}]
    path = tmp_path / "lima.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = LIMADataModule(data_files=str(path), tokenizer="embedded", max_seq_len=32, val_split_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="bhyt_pl.data.lima"):
        dm.setup("fit")
    full, _ = encode_conversation(load_tokenizer("embedded"), rows[1]["conversations"], max_seq_len=10_000)
    assert dm.truncated == {"rows": 1, "tokens_cut": len(full) - 32}  # ids hold max_seq_len + 1 tokens before the shift
    assert f"truncated 1 of 2 conversation(s) longer than max_seq_len=32: {len(full) - 32} token(s) cut" in caplog.text

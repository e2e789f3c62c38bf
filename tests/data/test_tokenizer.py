from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from bhyt_pl.data import DEFAULT_TOKENIZER, EMBEDDED_DATA_FILES, SpecialTokens, load_tokenizer
from bhyt_pl.data.build_assets import shard_names, write_shards


def test_embedded_tokenizer_fits_the_tiny_preset_and_has_llama3_special_tokens():
    tok = load_tokenizer("embedded")
    assert Path(DEFAULT_TOKENIZER).is_absolute() and tok.get_vocab_size() <= 8192
    names = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|pad|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ]
    assert [tok.token_to_id(n) for n in names] == [0, 1, 2, 3, 4, 5]
    assert SpecialTokens.from_tokenizer(tok) == SpecialTokens(0, 1, 2, 3, 4, 5)
    # special tokens are single tokens inside text; encode() prepends BOS like Llama-3's tokenizer
    assert tok.encode("<|eot_id|>", add_special_tokens=False).ids == [5]
    assert tok.encode("In the beginning").ids[0] == 0


def test_embedded_tokenizer_round_trips_text():
    tok = load_tokenizer(DEFAULT_TOKENIZER)
    text = "In the beginning God created the heaven and the earth.\n  Ünïcode, tabs\tand 12345 survive: 漢字"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_embedded_corpus_is_c4_format_and_large_enough():
    import gzip

    assert len(EMBEDDED_DATA_FILES["train"]) % 2 == 0
    assert [Path(p).name for p in EMBEDDED_DATA_FILES["train"]] == shard_names("train", 8)
    chars = 0
    for path in EMBEDDED_DATA_FILES["train"] + EMBEDDED_DATA_FILES["validation"]:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        assert rows and all(list(r) == ["text", "timestamp", "url"] for r in rows)
        chars += sum(len(r["text"]) for r in rows)
    assert chars > 2_000_000


def test_shards_are_byte_identical_across_builds(tmp_path: Path):
    rows = [{"text": f"doc {i}", "timestamp": "2022-04-29T00:00:00Z", "url": "u"} for i in range(5)]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = write_shards(rows, tmp_path / "a", "train", 2)
    second = write_shards(rows, tmp_path / "b", "train", 2)
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_missing_special_tokens_are_named():
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \['<\|begin_of_text\|>'"):
        SpecialTokens.from_tokenizer(Tokenizer(models.BPE()))


def test_pad_falls_back_to_llama32_reserved_token_then_eos():
    tok = Tokenizer(models.BPE())
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    assert SpecialTokens.from_tokenizer(tok).pad_id == 1
    tok.add_special_tokens(["<|finetune_right_pad_id|>"])
    assert SpecialTokens.from_tokenizer(tok).pad_id == 2


def test_missing_file_and_unreachable_hub_name_the_alternative(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist; the embedded one is"):
        load_tokenizer(str(tmp_path / "nope.json"))
    with pytest.raises(RuntimeError, match=r"cannot load tokenizer 'meta-llama/Llama-3.2-1B'.*tokenizer: embedded"):
        load_tokenizer("meta-llama/Llama-3.2-1B")

"""Sliding-window perplexity: windows equal lm-eval's rolling windows, and the score equals lm-eval's
rolling log-likelihood on the same text (through the adapter and through an lm-eval task)."""

from __future__ import annotations

import gzip
import json
import math
import re

import lm_eval
import pytest
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from bhyt_pl.data.tokenizer import load_tokenizer
from bhyt_pl.eval import BHyTLM, load_texts, perplexity, sliding_windows

from .conftest import small_model

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And God called the light Day, and the darkness he called Night. " * 9,
    "Amen.",
]


@pytest.mark.parametrize("n", [1, 10, 64, 65, 200])
@pytest.mark.parametrize("stride", [1, 7, 32, 64])
def test_windows_equal_lm_eval_rolling_windows(n: int, stride: int):
    ids = list(range(10, 10 + n))
    ours = sliding_windows(ids, 0, 64, stride)
    theirs = list(get_rolling_token_windows(ids, prefix_token=0, max_seq_len=64, context_len=64 - stride + 1))
    assert ours == [(list(a), list(b)) for a, b in theirs]
    if stride == 64:  # disjoint windows: exactly loglikelihood_rolling's
        assert [(a[: len(a) - len(b) + 1], b) for a, b in ours] == [make_disjoint_window(w) for w in theirs]
    assert [t for _, targets in ours for t in targets] == ids  # every token predicted once


def test_stride_out_of_range_raises():
    with pytest.raises(ValueError, match=r"stride must be in \[1, max_length=64\]"):
        sliding_windows([1, 2], 0, 64, 65)


def test_perplexity_equals_adapter_rolling_loglikelihood():
    model = small_model("bhyt")
    tok = load_tokenizer("embedded")
    lm = BHyTLM(model, tok, batch_size=3)
    reqs = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=0) for t in TEXTS]
    rolling = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    result = perplexity(model, tok, TEXTS, max_length=64, stride=64, batch_size=2)
    assert result.nll == pytest.approx(-sum(rolling), rel=1e-5)
    assert result.tokens == sum(len(tok.encode(t, add_special_tokens=False).ids) for t in TEXTS)
    assert result.perplexity == pytest.approx(math.exp(result.nll / result.tokens))
    overlapping = perplexity(model, tok, TEXTS, max_length=64, stride=16)
    assert overlapping.tokens == result.tokens and overlapping.nll != pytest.approx(result.nll)


def test_perplexity_equals_lm_eval_rolling_task(tmp_path):
    """lm-eval's own loglikelihood_rolling task on the same texts reports exp(nll / words) as word perplexity."""
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (tmp_path / "ppl.yaml").write_text(
        f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        "output_type: loglikelihood_rolling\ntest_split: test\nnum_fewshot: 0\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
    )
    model = small_model("rmsnorm")
    tok = load_tokenizer("embedded")
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = lm_eval.simple_evaluate(BHyTLM(model, tok), tasks=["tiny_ppl"], task_manager=manager, log_samples=False)
    words = sum(len(re.split(r"\s+", t)) for t in TEXTS)  # lm-eval's word count (count_words)
    result = perplexity(model, tok, TEXTS, max_length=64, stride=64)
    assert out["results"]["tiny_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(result.nll / words), rel=1e-5)


def test_load_texts_local_files(tmp_path):
    shard = tmp_path / "c4-validation.json.gz"
    with gzip.open(shard, "wt") as f:
        f.write(json.dumps({"text": "one", "url": "u"}) + "\n" + json.dumps({"text": "two"}) + "\n")
    raw = tmp_path / "wiki.test.raw"
    raw.write_text(" = Title = \n\n Body text .\n")
    assert load_texts("c4", str(shard)) == ["one", "two"]
    assert load_texts("c4", str(shard), max_documents=1) == ["one"]
    assert load_texts("wikitext2", [str(raw)]) == [raw.read_text()]
    assert load_texts("wikitext2", str(shard)) == ["one\n\ntwo"]  # WikiText rows are joined into one text
    assert len(load_texts("c4", "embedded")) == 30
    with pytest.raises(ValueError, match="unknown perplexity source 'ptb'; sources: c4, wikitext2"):
        load_texts("ptb", str(shard))
    with pytest.raises(FileNotFoundError, match="do not exist"):
        load_texts("c4", str(tmp_path / "missing.json.gz"))


def test_hub_source_offline_names_the_local_alternative():
    with pytest.raises(RuntimeError, match="Offline, pass local files"):
        load_texts("wikitext2")

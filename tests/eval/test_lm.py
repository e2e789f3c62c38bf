"""BHyTLM: log-likelihoods against hand computations from the model's logits, batching, rolling
windows, generation stops, BOS handling, the chat template and lm-eval's model registry."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from bhyt_pl.data.chat import ChatTemplate
from bhyt_pl.data.lima import encode_conversation
from bhyt_pl.data.tokenizer import load_tokenizer
from bhyt_pl.eval import BHyTLM, render_chat
from bhyt_pl.norms import registered_norms

from .conftest import small_model

TOK = load_tokenizer("embedded")
BOS = 0
PAIRS = [
    ("In the beginning God created", " the heaven and the earth."),
    ("And the earth was without form, and void;", " and darkness was upon the face of the deep."),
    ("Question: who spake unto Moses?\nAnswer:", " the LORD"),
    ("And God said,", " Let there be light: and there was light."),
    ("Blessed are the meek:", " for they shall inherit the earth."),
]


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=0) for a in args]


def hand_loglikelihood(model, context: str, continuation: str) -> tuple[float, bool]:
    """float64 log p(continuation | BOS context) from one forward pass over the whole text."""
    whole = [BOS, *TOK.encode(context + continuation, add_special_tokens=False).ids]
    n_ctx = 1 + len(TOK.encode(context, add_special_tokens=False).ids)
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]]))[0].double()  # [T-1, V]
    logp = F.log_softmax(logits, dim=-1)
    positions = range(n_ctx - 1, len(whole) - 1)  # logits at t predict whole[t + 1]
    total = sum(logp[t, whole[t + 1]].item() for t in positions)
    greedy = all(logp[t].argmax().item() == whole[t + 1] for t in positions)
    return total, greedy


def test_tok_encode_prepends_one_bos():
    lm = BHyTLM(small_model(), "embedded")
    bare = TOK.encode("In the beginning", add_special_tokens=False).ids
    assert lm.tok_encode("In the beginning") == [BOS, *bare]
    assert lm.tok_encode("In the beginning", add_special_tokens=False) == bare
    assert lm.tok_encode("<|begin_of_text|>In the beginning") == [BOS, *bare]  # chat-templated text: no second BOS
    assert lm.prefix_token_id == BOS and lm.eot_token_id == 1


def test_loglikelihood_equals_hand_computation():
    model = small_model("bhyt")
    lm = BHyTLM(model, "embedded", batch_size=3)
    got = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(PAIRS, got):
        want, want_greedy = hand_loglikelihood(model, context, continuation)
        assert logprob == pytest.approx(want, abs=1e-4)
        assert greedy == want_greedy


def test_empty_context_conditions_on_bos():
    model = small_model()
    lm = BHyTLM(model, "embedded")
    [(logprob, _)] = lm.loglikelihood(requests("loglikelihood", [("", "And God said")]), disable_tqdm=True)
    ids = [BOS, *TOK.encode("And God said", add_special_tokens=False).ids]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0].double(), dim=-1)
    assert logprob == pytest.approx(sum(logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)), abs=1e-4)


@pytest.mark.parametrize("norm", registered_norms())
def test_batched_equals_one_at_a_time(norm: str):
    model = small_model(norm)
    pairs = PAIRS + [(c + continuation, " Amen.") for c, continuation in PAIRS[:3]]  # varied lengths, shared prefixes
    batched = BHyTLM(model, "embedded", batch_size=4).loglikelihood(requests("loglikelihood", pairs), True)
    single = BHyTLM(model, "embedded", batch_size=1).loglikelihood(requests("loglikelihood", pairs), True)
    for (a, ga), (b, gb) in zip(batched, single):
        assert a == pytest.approx(b, abs=1e-4) and ga == gb


def test_long_context_is_left_truncated_to_max_seq_len():
    model = small_model()  # max_seq_len 64
    lm = BHyTLM(model, "embedded")
    context = " ".join(["And it came to pass"] * 40)  # ~160 tokens
    ((logprob, _),) = lm.loglikelihood(requests("loglikelihood", [(context, " that")]), disable_tqdm=True)
    whole = lm.tok_encode(context + " that")[-65:]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([whole[:-1]]))[0].double(), dim=-1)
    assert logprob == pytest.approx(logp[-1, whole[-1]].item(), abs=1e-4)


def test_rolling_equals_summed_token_logprobs():
    model = small_model("bhyt")
    lm = BHyTLM(model, "embedded", batch_size=2)
    short = "In the beginning God created the heaven and the earth."
    long = " ".join([short] * 12)  # > 64 tokens: several disjoint windows
    got = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(short,), (long,)]), disable_tqdm=True)
    ids = [BOS, *TOK.encode(short, add_special_tokens=False).ids]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0].double(), dim=-1)
    assert got[0] == pytest.approx(sum(logp[t, ids[t + 1]].item() for t in range(len(ids) - 1)), abs=1e-4)
    # the long text: targets in disjoint chunks of 64; each chunk is predicted from the 64 tokens before its
    # last target (the first chunk from BOS on, the last, shorter one with extra left context), as lm-eval does
    seq = [BOS, *TOK.encode(long, add_special_tokens=False).ids]
    n, total = len(seq) - 1, 0.0
    for p in range(0, n, 64):
        q = min(p + 64, n)  # predict seq[p + 1 : q + 1]
        inputs = seq[max(0, q - 64) : q]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([inputs]))[0].double(), dim=-1)
        targets = seq[p + 1 : q + 1]
        offset = len(inputs) - len(targets)
        total += sum(logp[offset + t, targets[t]].item() for t in range(len(targets)))
    assert len(seq) - 1 > 64 * 2
    assert got[1] == pytest.approx(total, abs=1e-3)


def test_generation_matches_kv_cache_generator_and_stops_at_until():
    model = small_model()
    lm = BHyTLM(model, "embedded")
    context = "And God said, Let there be light"
    [free] = lm.generate_until(requests("generate_until", [(context, {"until": [], "max_gen_toks": 12})]), True)
    prompt = torch.tensor([lm.tok_encode(context)])
    tokens = model.generate(prompt, max_new_tokens=12)[0, prompt.shape[1] :].tolist()
    assert free == TOK.decode(tokens, skip_special_tokens=False)  # greedy, same KV-cache path
    assert len(TOK.encode(free, add_special_tokens=False).ids) <= 12
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    [cut] = lm.generate_until(requests("generate_until", [(context, {"until": [stop], "max_gen_toks": 12})]), True)
    assert cut == free[: free.index(stop)]
    [short] = lm.generate_until(requests("generate_until", [(context, {"until": "\n\n", "max_gen_toks": 3})]), True)
    assert free.startswith(short) and len(TOK.encode(short, add_special_tokens=False).ids) <= 3


@pytest.mark.slow  # one inductor compile of the decode step: about 100 s on a loaded 2-core machine
def test_compiled_generation_equals_eager():
    """``compile=True`` decodes through ``Llama.generate(compile=True)``: the same greedy answers, stop
    strings and budgets, with one compiled graph per cache-length bucket."""
    torch._dynamo.reset()
    model = small_model()
    eager, compiled = BHyTLM(model, "embedded"), BHyTLM(model, "embedded", compile="true")
    assert compiled.compile and not eager.compile and compiled.get_model_info()["compile"]
    args = [
        ("And God said, Let there be light", {"until": [], "max_gen_toks": 12}),
        ("In the beginning", {"until": ["earth"], "max_gen_toks": 9}),
        ("Blessed are the meek:", {"until": "\n\n", "max_gen_toks": 3}),
    ]
    expected = eager.generate_until(requests("generate_until", args), True)
    calls = []
    generate = model.generate
    model.generate = lambda *a, **k: calls.append(k["compile"]) or generate(*a, **k)
    try:
        assert compiled.generate_until(requests("generate_until", args), True) == expected
    finally:
        del model.generate
    assert calls == [True, True, True]


def test_chat_template_matches_the_sft_data_module():
    turns = ["Who created the heaven?", "God created the heaven and the earth."]
    template = ChatTemplate()
    ids, _ = encode_conversation(TOK, turns, template, max_seq_len=512)
    lm = BHyTLM(small_model(), "embedded")
    prompt = lm.apply_chat_template([{"role": "user", "content": turns[0]}], add_generation_prompt=True)
    prompt_ids = lm.tok_encode(prompt)
    assert prompt_ids == ids[: len(prompt_ids)] and prompt_ids.count(BOS) == 1
    whole = render_chat(
        [{"role": "user", "content": turns[0]}, {"role": "assistant", "content": turns[1]}],
        template,
        add_generation_prompt=False,
    )
    assert whole.endswith(turns[1])  # a prefilled assistant turn stays open


def test_registered_for_lm_eval_model_args(small_checkpoint):
    cls = get_model("bhyt_pl")
    assert cls is BHyTLM
    lm = cls.create_from_arg_string(
        f"ckpt_path={small_checkpoint},max_length=32", {"batch_size": 2, "max_batch_size": None, "device": "cpu"}
    )
    assert lm.max_length == 32 and lm.batch_size == 2 and lm.model.config.norm == "bhyt" and not lm.compile
    assert cls.create_from_arg_string(f"ckpt_path={small_checkpoint},compile=True").compile
    with pytest.raises(ValueError, match="compile must be true or false, got 'maybe'"):
        cls.create_from_arg_string(f"ckpt_path={small_checkpoint},compile=maybe")
    with pytest.raises(ValueError, match="accept ckpt_path, tokenizer"):
        cls.create_from_arg_string(f"ckpt_path={small_checkpoint},pretrained=gpt2")
    with pytest.raises(ValueError, match="no ckpt_path"):
        cls.create_from_arg_obj({})


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="bhyt_pl.model.Llama"):
        BHyTLM(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"max_length must be in \[2, config.max_seq_len=64\]"):
        BHyTLM(small_model(), max_length=65)

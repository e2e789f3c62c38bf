"""The embedded evaluation suite: lm-eval task YAMLs over the bundled corpus, for offline runs.

lm-eval resolves relative ``data_files`` against the working directory, not the YAML, so the suite is
written on demand with absolute paths: ``write_embedded_suite(dir)`` writes JSON-lines data built from
the 30 held-out validation chapters of the embedded corpus (never trained on) and one YAML per task,
in the formats of the paper's tasks:

=======================  =====================  ==========================================================
task                     shaped like            item
=======================  =====================  ==========================================================
``kjv_next_verse``       arc_easy (4 choices)   a verse; choose the next verse among it and 3 word-order
                                                shuffles of it (chance 1/4; needs word-order knowledge)
``kjv_next_verse_hard``  arc_easy (4 choices)   a verse; choose the next verse among it and 3 verses of
                                                other chapters (chance 1/4; needs context)
``kjv_word_order``       boolq (no/yes)         a verse, original or shuffled: "is it in order?"
``kjv_perplexity``       wikitext (rolling)     a whole chapter; word/byte perplexity, bits per byte
``kjv_complete``         generate_until         first half of a verse; greedy completion until a newline,
                                                exact match
=======================  =====================  ==========================================================

The first 5 chapters give the few-shot examples (``train`` split), the other 25 the test items.
``python -m bhyt_pl eval --include_path embedded`` writes the suite to a temporary directory and runs
the ``bhyt_embedded`` group (all five tasks).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["EMBEDDED_GROUP", "EMBEDDED_TASKS", "build_items", "write_embedded_suite"]

EMBEDDED_GROUP = "bhyt_embedded"
EMBEDDED_TASKS = ("kjv_next_verse", "kjv_next_verse_hard", "kjv_word_order", "kjv_perplexity", "kjv_complete")
_FEWSHOT_CHAPTERS = 5
_MIN_WORDS = 6  # shorter verses have too few distinct word orders
_SEED = 1611

_MULTIPLE_CHOICE = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: multiple_choice
training_split: train
test_split: test
fewshot_split: train
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

_YES_NO = """\
task: kjv_word_order
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: multiple_choice
training_split: train
test_split: test
fewshot_split: train
doc_to_text: "{{{{passage}}}}\\nQuestion: {{{{question}}}}?\\nAnswer:"
doc_to_target: label
doc_to_choice: ["no", "yes"]
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""

_ROLLING = """\
task: kjv_perplexity
dataset_path: json
dataset_kwargs:
  data_files:
    test: {test}
output_type: loglikelihood_rolling
test_split: test
num_fewshot: 0
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""

_GENERATE = """\
task: kjv_complete
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: generate_until
training_split: train
test_split: test
fewshot_split: train
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 48
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: ["^\\\\s+", "\\\\s+$"]
metadata:
  version: 1.0
"""

_GROUP = """\
group: {group}
task: [{tasks}]
metadata:
  version: 1.0
"""


def _chapters() -> list[list[str]]:
    from bhyt_pl.data.c4 import EMBEDDED_DATA_FILES, read_documents

    return [
        [v.strip() for v in doc["text"].split("\n") if v.strip()]
        for doc in read_documents(EMBEDDED_DATA_FILES["validation"])
    ]


def _shuffled(verse: str, rng: random.Random, n: int) -> list[str]:
    """``n`` distinct word orders of ``verse``, none equal to it."""
    words, seen, out = verse.split(), {verse}, []
    for _ in range(100 * n):
        candidate = words[:]
        rng.shuffle(candidate)
        text = " ".join(candidate)
        if text not in seen:
            seen.add(text)
            out.append(text)
            if len(out) == n:
                break
    return out


def _choice_item(i: int, question: str, answer: str, distractors: list[str], rng: random.Random) -> dict:
    texts = [answer, *distractors]
    rng.shuffle(texts)
    labels = ["A", "B", "C", "D"][: len(texts)]
    return {
        "id": f"kjv-{i}",
        "question": question,
        "choices": {"text": texts, "label": labels},
        "answerKey": labels[texts.index(answer)],
    }


def build_items(max_items: int | None = 200) -> dict[str, dict[str, list[dict]]]:
    """``{task: {"train": rows, "test": rows}}`` for every task of the suite (deterministic).

    Args:
        max_items: most test rows per task (chapters for ``kjv_perplexity``); None keeps all.
    """
    rng = random.Random(_SEED)
    chapters = _chapters()
    splits = {"train": chapters[:_FEWSHOT_CHAPTERS], "test": chapters[_FEWSHOT_CHAPTERS:]}
    all_verses = [(c, v) for c, chapter in enumerate(chapters) for v in chapter]
    items: dict[str, dict[str, list[dict]]] = {task: {"train": [], "test": []} for task in EMBEDDED_TASKS}
    for split, split_chapters in splits.items():
        base = 0 if split == "train" else _FEWSHOT_CHAPTERS
        for c, chapter in enumerate(split_chapters, start=base):
            for v, (verse, nxt) in enumerate(zip(chapter, chapter[1:])):
                key = len(items["kjv_next_verse"][split])
                if len(nxt.split()) >= _MIN_WORDS:
                    shuffles = _shuffled(nxt, rng, 3)
                    if len(shuffles) == 3:
                        items["kjv_next_verse"][split].append(_choice_item(key, verse, nxt, shuffles, rng))
                        order = v % 2 == 0  # alternate labels: exactly balanced yes/no
                        items["kjv_word_order"][split].append(
                            {
                                "passage": nxt if order else shuffles[0],
                                "question": "is this verse in its original word order",
                                "label": int(order),
                            }
                        )
                    others = [w for cc, w in all_verses if cc != c and abs(len(w) - len(nxt)) <= 0.3 * len(nxt)]
                    if len(others) >= 3:
                        distractors = rng.sample(others, 3)
                        items["kjv_next_verse_hard"][split].append(_choice_item(key, verse, nxt, distractors, rng))
                    words = nxt.split()
                    half = len(words) // 2
                    items["kjv_complete"][split].append(
                        {"context": verse + "\n" + " ".join(words[:half]), "answer": " ".join(words[half:])}
                    )
            items["kjv_perplexity"][split].append({"text": "\n".join(chapter)})
    for task in items.values():  # a fixed, spread-out subset rather than the first chapters only
        rng.shuffle(task["test"])
        task["test"] = task["test"][:max_items] if max_items is not None else task["test"]
    return items


def write_embedded_suite(out_dir: str | Path, max_items: int | None = 200) -> Path:
    """Write the suite's data and YAMLs into ``out_dir`` (absolute data paths) and return it.

    Register it with ``TaskManager(include_path=str(out_dir), include_defaults=False)``.
    """
    out = Path(out_dir).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    items = build_items(max_items)
    paths: dict[str, dict[str, str]] = {}
    for task, splits in items.items():
        paths[task] = {}
        for split, rows in splits.items():
            if not rows:
                continue
            path = out / "data" / f"{task}.{split}.jsonl"
            path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
            paths[task][split] = json.dumps(str(path))  # a quoted YAML scalar, whatever the path holds
    for task in ("kjv_next_verse", "kjv_next_verse_hard"):
        (out / f"{task}.yaml").write_text(_MULTIPLE_CHOICE.format(task=task, **paths[task]), encoding="utf-8")
    (out / "kjv_word_order.yaml").write_text(_YES_NO.format(**paths["kjv_word_order"]), encoding="utf-8")
    (out / "kjv_perplexity.yaml").write_text(_ROLLING.format(**paths["kjv_perplexity"]), encoding="utf-8")
    (out / "kjv_complete.yaml").write_text(_GENERATE.format(**paths["kjv_complete"]), encoding="utf-8")
    group = _GROUP.format(group=EMBEDDED_GROUP, tasks=", ".join(EMBEDDED_TASKS))
    (out / f"{EMBEDDED_GROUP}.yaml").write_text(group, encoding="utf-8")
    return out

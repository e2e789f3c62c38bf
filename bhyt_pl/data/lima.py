"""LIMA for supervised fine-tuning (docs/method.md, section 6): chat-templated conversations, prompt tokens masked
with -100 so only assistant turns are supervised, truncated to ``max_seq_len``, right-padded.

Accepted rows: LIMA's (``conversations``: strings alternating user/assistant, starting with the user;
``source``) and the alpaca style of LIMA-1k copies (``instruction``, ``input``, ``output``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from bhyt_pl.data.chat import ChatTemplate, chat_segments
from bhyt_pl.data.eval_set import eval_set, eval_stages
from bhyt_pl.data.tokenizer import HUB_TOKENIZER, SpecialTokens, load_tokenizer
from bhyt_pl.run_facts import build_run_facts
from bhyt_pl.validation import raise_if_problems

__all__ = ["LIMADataModule", "SFTDataset", "collate_sft", "encode_conversation", "parse_row"]

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label of positions without loss (``cross_entropy(..., ignore_index=-100)``)."""


def parse_row(row: dict[str, Any]) -> list[str] | str:
    """The turns of one row (user, assistant, user, ...), or the reason it is skipped.

    LIMA rows give ``conversations``; alpaca rows become one turn pair, the user turn being
    ``instruction`` followed by ``input`` (when non-empty) after a blank line. A field that is
    missing or null (``missing_field``: an alpaca row without ``instruction`` would otherwise train on
    the prompt ``"None"``) or not a string (``not_strings``) skips the row. Rows of a JSON file are
    read into one table, so a key another row has appears here as None.
    """
    conversations = row.get("conversations")
    if conversations is not None:
        turns = conversations
    elif "conversations" in row and all(row.get(key) is None for key in ("instruction", "input", "output")):
        return "missing_field"  # a LIMA row whose conversations are null
    elif any(row.get(key) is not None for key in ("instruction", "input", "output")):
        instruction, extra, output = row.get("instruction"), row.get("input"), row.get("output")
        if instruction is None or output is None:
            return "missing_field"
        if not all(isinstance(v, str) for v in (instruction, output)) or not isinstance(extra, str | None):
            return "not_strings"
        if not instruction.strip():
            return "empty_turn"
        turns = [instruction if not extra else f"{instruction}\n\n{extra}", output]
    else:
        return "unknown_format"
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        return "not_strings"
    if len(turns) == 0 or len(turns) % 2:
        return "odd_length"  # includes LIMA's test split, whose rows have prompts only
    if any(not t.strip() for t in turns):
        return "empty_turn"
    return turns


def encode_conversation(
    tokenizer: Tokenizer,
    turns: Sequence[str],
    template: ChatTemplate = ChatTemplate(),
    max_seq_len: int = 2048,
    mask_prompt: bool = True,
    truncated: Counter | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and shifted labels of one conversation, both of length ``<= max_seq_len``.

    ``labels[t]`` is ``ids[t + 1]`` of the full token sequence where that token is supervised, else
    -100. When the conversation exceeds ``max_seq_len + 1`` tokens, the prefix before the final
    assistant turn keeps its first segment (BOS) and its tail, and the final response keeps its start;
    the response gets at least half of the budget (all of it if it is shorter). A truncation is counted
    in ``truncated`` (``rows`` += 1, ``tokens_cut`` += the tokens dropped) when given.
    """
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": content} for i, content in enumerate(turns)]
    segments = chat_segments(messages, template)
    encoded = [tokenizer.encode(text, add_special_tokens=False).ids if text else [] for text, _ in segments]
    flags = [[supervised or not mask_prompt] * len(ids) for ids, (_, supervised) in zip(encoded, segments)]

    head, head_flags = encoded[0], flags[0]  # the template prefix (BOS): always kept
    body = [t for ids in encoded[1:-1] for t in ids]
    body_flags = [f for fl in flags[1:-1] for f in fl]
    response, response_flags = encoded[-1], flags[-1]
    budget = max_seq_len + 1 - len(head)  # ids hold one token more than the shifted rows
    if len(body) + len(response) > budget:
        if truncated is not None:
            truncated.update(rows=1, tokens_cut=len(body) + len(response) - budget)
        keep_response = min(len(response), max(budget - len(body), budget // 2))
        keep_body = budget - keep_response
        body, body_flags = body[len(body) - keep_body :], body_flags[len(body_flags) - keep_body :]
        response, response_flags = response[:keep_response], response_flags[:keep_response]
    ids = head + body + response
    supervised = head_flags + body_flags + response_flags
    labels = [t if s else IGNORE_INDEX for t, s in zip(ids[1:], supervised[1:])]
    return ids[:-1], labels


class SFTDataset(Dataset):
    """Pre-tokenized conversations: items are ``{"input_ids": [T], "labels": [T]}`` LongTensors."""

    def __init__(self, examples: Sequence[tuple[list[int], list[int]]]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels = self.examples[index]
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "labels": torch.tensor(labels, dtype=torch.long)}


def collate_sft(items: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest item: ``input_ids`` with ``pad_id``, ``labels`` with -100; [B, T]."""
    length = max(item["input_ids"].numel() for item in items)
    input_ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    labels = torch.full((len(items), length), IGNORE_INDEX, dtype=torch.long)
    for row, item in enumerate(items):
        n = item["input_ids"].numel()
        input_ids[row, :n], labels[row, :n] = item["input_ids"], item["labels"]
    return {"input_ids": input_ids, "labels": labels}


class _Collate:
    """Picklable ``collate_sft`` with a bound pad id (DataLoader workers may be spawned)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return collate_sft(items, self.pad_id)


class LIMADataModule(LightningDataModule):
    """LIMA (``GAIR/lima``, gated) or a local JSON/JSONL file in LIMA's or the alpaca format.

    Batches: ``input_ids`` [B, T] right-padded with the pad id and ``labels`` [B, T], shifted
    (``labels[:, t]`` is the target at position t), -100 on prompt and padding positions.

    Example:
        >>> dm = LIMADataModule(data_files="tests/data/fixtures/lima_tiny.jsonl", tokenizer="embedded")
        >>> dm.setup("fit")  # doctest: +SKIP

    Args:
        path: Hub dataset, used when ``data_files`` is None. Gated: accept its terms and log in
            (``hf auth login`` or ``HF_TOKEN``).
        data_files: local ``.json``/``.jsonl`` file(s) (a path, glob or list) instead of the Hub.
        split: split to train on (LIMA's ``test`` split has no responses).
        tokenizer: ``tokenizer.json`` path, a Hub name, or ``"embedded"``.
        max_seq_len: longest input row ``T``; longer conversations are truncated.
        batch_size: conversations per batch, per device.
        num_workers: DataLoader workers per device.
        mask_prompt: supervise only assistant turns (``False``: every non-padding token).
        val_split_fraction: fraction of conversations held out for validation (0: none).
        seed: seed of the validation split and of the shuffling.
        system_prompt: optional system turn prepended to every conversation.
    """

    def __init__(
        self,
        path: str = "GAIR/lima",
        data_files: str | list[str] | None = None,
        split: str = "train",
        tokenizer: str = HUB_TOKENIZER,
        max_seq_len: int = 2048,
        batch_size: int = 4,
        num_workers: int = 0,
        mask_prompt: bool = True,
        val_split_fraction: float = 0.05,
        seed: int = 42,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__()
        problems = [
            f"{field} must be a positive int, got {value!r}"
            for field, value in (("max_seq_len", max_seq_len), ("batch_size", batch_size))
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0
        ]
        if not isinstance(num_workers, int) or num_workers < 0:
            problems.append(f"num_workers must be an int >= 0, got {num_workers!r}")
        if not 0.0 <= val_split_fraction < 1.0:
            problems.append(f"val_split_fraction must be in [0, 1), got {val_split_fraction!r}")
        raise_if_problems("LIMADataModule arguments", problems)
        self.save_hyperparameters()
        self.path, self.data_files, self.split, self.tokenizer = path, data_files, split, tokenizer
        self.max_seq_len, self.batch_size, self.num_workers = max_seq_len, batch_size, num_workers
        self.mask_prompt, self.val_split_fraction, self.seed = mask_prompt, val_split_fraction, seed
        self.template = ChatTemplate(system=system_prompt)
        self.skipped: Counter = Counter()
        """Rows skipped at setup, by reason (``odd_length``, ``empty_turn``, ``missing_field``, ...)."""
        self.truncated: Counter = Counter()
        """Conversations longer than ``max_seq_len`` at setup: ``rows`` and ``tokens_cut``."""
        self.special_tokens: SpecialTokens | None = None
        self.train_dataset: SFTDataset | None = None
        self.val_dataset: SFTDataset | None = None

    def _rows(self) -> Iterable[dict[str, Any]]:
        import datasets

        if self.data_files is not None:
            try:
                return datasets.load_dataset("json", data_files=self.data_files, split="train")
            except FileNotFoundError as err:
                raise FileNotFoundError(
                    f"LIMA data_files {self.data_files!r} match no file ({err}); give a JSON/JSONL file in "
                    f"LIMA's (conversations, source) or alpaca's (instruction, input, output) format"
                ) from err
        try:
            return datasets.load_dataset(self.path, split=self.split)
        except Exception as err:  # offline, gated or unknown: all end in the same advice
            raise RuntimeError(
                f"cannot load the Hub dataset {self.path!r} split {self.split!r}: {type(err).__name__}: {err}. "
                f"{self.path} is gated: accept its terms on the Hub and authenticate (`hf auth login` or HF_TOKEN), "
                f"or pass a local JSON/JSONL copy with --data.data_files path/to/lima_train.jsonl"
            ) from err

    def run_facts(self) -> dict[str, Any]:
        """What this data module tells the model about the run (``bhyt_pl.run_config.RunFactsSource``): every
        registered run fact of its sequence length and per-device batch size (``bhyt_pl.run_facts``); a norm
        scheme binds those it declares."""
        return build_run_facts(seq_len=self.max_seq_len, batch_size=self.batch_size)

    def prepare_data(self) -> None:
        load_tokenizer(self.tokenizer)
        self._rows()  # downloads (Hub) or builds the Arrow cache (local) once, on rank 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is None:
            self._build_datasets()
        if self.val_dataset is not None:
            for eval_stage in eval_stages(stage):
                # before any step: a rank without a conversation would leave the others waiting in the pass
                eval_set(self.trainer, eval_stage, self.batch_size).require(
                    len(self.val_dataset),
                    f"LIMA validation split has {len(self.val_dataset)} conversation(s) "
                    f"(val_split_fraction={self.val_split_fraction})",
                    "raise --data.init_args.val_split_fraction or use fewer devices",
                )

    def _build_datasets(self) -> None:
        tokenizer = load_tokenizer(self.tokenizer)
        self.special_tokens = SpecialTokens.from_tokenizer(tokenizer)
        self.skipped, self.truncated = Counter(), Counter()
        examples = []
        for row in self._rows():
            turns = parse_row(row)
            if isinstance(turns, str):
                self.skipped[turns] += 1
                continue
            examples.append(
                encode_conversation(
                    tokenizer, turns, self.template, self.max_seq_len, self.mask_prompt, truncated=self.truncated
                )
            )
        if self.skipped:
            log.warning(
                "LIMA: skipped %d malformed conversation(s): %s", sum(self.skipped.values()), dict(self.skipped)
            )
        if self.truncated:
            log.warning(
                "LIMA: truncated %d of %d conversation(s) longer than max_seq_len=%d: %d token(s) cut in all",
                self.truncated["rows"], len(examples), self.max_seq_len, self.truncated["tokens_cut"],
            )  # fmt: skip
        if not examples:
            raise ValueError(
                f"LIMA source {self.data_files or self.path!r} has no valid conversation ({dict(self.skipped)})"
            )
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(self.seed)).tolist()
        n_val = round(len(examples) * self.val_split_fraction)
        self.val_dataset = SFTDataset([examples[i] for i in order[:n_val]]) if n_val else None
        self.train_dataset = SFTDataset([examples[i] for i in order[n_val:]])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.num_workers,
            collate_fn=_Collate(self.special_tokens.pad_id),
        )

    def _eval_loader(self, stage: str) -> DataLoader | list:
        """The evaluation set (``bhyt_pl.data.eval_set``): the first K held-out conversations in their order,
        conversation i on rank i mod W, so every rank gets the same number of batches."""
        if self.val_dataset is None:
            return []
        return eval_set(self.trainer, stage, self.batch_size).loader(
            self.val_dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            collate_fn=_Collate(self.special_tokens.pad_id),
        )

    def val_dataloader(self) -> DataLoader | list:
        """The held-out conversations, the first ``trainer.limit_val_batches`` x ``batch_size`` of them."""
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader | list:
        """LIMA's own test split has prompts only: ``test`` reads the held-out validation conversations."""
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader | list:
        """``predict`` scores the held-out conversations (per-sequence NLL of the responses)."""
        return self._eval_loader("predict")

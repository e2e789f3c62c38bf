"""Tokenizer loading and the special-token ids every data module needs.

Two tokenizers matter: the Llama-3.2 tokenizer on the Hub (the paper's, 128k vocabulary) and the
embedded byte-level BPE in ``assets/tokenizer.json`` (8k vocabulary, trained on the embedded corpus by
``python -m bhyt_pl.data.build_assets``). Both carry Llama-3's special-token names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

__all__ = [
    "ASSETS_DIR",
    "BOS",
    "CHAT_SPECIAL_TOKENS",
    "DEFAULT_TOKENIZER",
    "EMBEDDED",
    "EOS",
    "HUB_TOKENIZER",
    "PAD",
    "SpecialTokens",
    "load_tokenizer",
]

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
DEFAULT_TOKENIZER = str(ASSETS_DIR / "tokenizer.json")
"""Absolute path of the embedded 8k byte-level BPE ``tokenizer.json``."""
HUB_TOKENIZER = "meta-llama/Llama-3.2-1B"
"""The paper's tokenizer (docs/method.md, section 5), a gated Hub repository."""
EMBEDDED = "embedded"
"""Keyword that selects an embedded asset (``tokenizer: embedded``, ``data_files: embedded``)."""

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
START_HEADER, END_HEADER, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
CHAT_SPECIAL_TOKENS = (BOS, EOS, PAD, START_HEADER, END_HEADER, EOT)
"""Special tokens of the embedded tokenizer, in id order (ids 0-5)."""
# Llama-3.1/3.2 ship no <|pad|>; their reserved right-padding token is the conventional pad.
_PAD_FALLBACKS = (PAD, "<|finetune_right_pad_id|>")


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the special tokens of one tokenizer.

    Example:
        >>> ids = SpecialTokens.from_tokenizer(load_tokenizer("embedded"))
        >>> (ids.bos_id, ids.eos_id, ids.pad_id)
        (0, 1, 2)
    """

    bos_id: int
    """``<|begin_of_text|>``: starts every document and every conversation."""
    eos_id: int
    """``<|end_of_text|>``: ends every pretraining document."""
    pad_id: int
    """Right padding of SFT batches (``<|pad|>``, else ``<|finetune_right_pad_id|>``, else EOS)."""
    start_header_id: int | None = None
    """``<|start_header_id|>`` of the chat template, None if the tokenizer lacks it."""
    end_header_id: int | None = None
    """``<|end_header_id|>`` of the chat template, None if the tokenizer lacks it."""
    eot_id: int | None = None
    """``<|eot_id|>``: ends every chat turn, None if the tokenizer lacks it."""

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> SpecialTokens:
        """Look the Llama-3 special tokens up in ``tokenizer``.

        Raises:
            ValueError: if BOS or EOS is missing (documents could not be delimited).
        """
        missing = [t for t in (BOS, EOS) if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(
                f"tokenizer lacks the special token(s) {missing}; bhyt_pl needs Llama-3's {BOS} and {EOS} "
                f"(the embedded tokenizer {DEFAULT_TOKENIZER} and {HUB_TOKENIZER} both have them)"
            )
        bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
        pad = next((i for t in _PAD_FALLBACKS if (i := tokenizer.token_to_id(t)) is not None), eos)
        return cls(
            bos_id=bos,
            eos_id=eos,
            pad_id=pad,
            start_header_id=tokenizer.token_to_id(START_HEADER),
            end_header_id=tokenizer.token_to_id(END_HEADER),
            eot_id=tokenizer.token_to_id(EOT),
        )


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """Load a ``tokenizers.Tokenizer``.

    Args:
        name_or_path: ``"embedded"`` (the bundled 8k tokenizer), a ``tokenizer.json`` file, a directory
            holding one, or a Hub repository name such as ``"meta-llama/Llama-3.2-1B"``.

    Raises:
        FileNotFoundError: a path-like argument that does not exist.
        RuntimeError: a Hub name that cannot be loaded (offline, gated, unknown); the message names the
            local alternative.
    """
    if name_or_path == EMBEDDED:
        name_or_path = DEFAULT_TOKENIZER
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    if path.suffix == ".json" or name_or_path.startswith((".", "/", "~")) or os.sep + os.sep in name_or_path:
        raise FileNotFoundError(f"tokenizer file {str(path)!r} does not exist; the embedded one is {DEFAULT_TOKENIZER}")
    try:
        from huggingface_hub import get_token

        return Tokenizer.from_pretrained(name_or_path, token=get_token())
    except Exception as err:  # the Rust hub client raises plain Exceptions; re-raised with the fix below
        raise RuntimeError(
            f"cannot load tokenizer {name_or_path!r} from the Hugging Face Hub ({type(err).__name__}: {err}). "
            f"Gated repositories such as {HUB_TOKENIZER} need accepted terms and a token (`hf auth login` or "
            f"HF_TOKEN). Offline, pass a local tokenizer.json instead: the embedded one is "
            f"`tokenizer: embedded` ({DEFAULT_TOKENIZER})."
        ) from err

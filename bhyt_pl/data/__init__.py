"""Data: C4 streaming for pretraining, LIMA for SFT, the embedded corpus and tokenizer.

Everything heavy (``datasets``, file resolution, tokenizer loading) happens in ``prepare_data``/``setup``.
"""

from bhyt_pl.data.c4 import EMBEDDED_DATA_FILES, C4DataModule, PackedWindows, ResumableLoader, read_documents
from bhyt_pl.data.chat import ChatTemplate, render_chat
from bhyt_pl.data.lima import LIMADataModule, collate_sft, encode_conversation, parse_row
from bhyt_pl.data.tokenizer import DEFAULT_TOKENIZER, EMBEDDED, HUB_TOKENIZER, SpecialTokens, load_tokenizer

__all__ = [
    "DEFAULT_TOKENIZER",
    "EMBEDDED",
    "EMBEDDED_DATA_FILES",
    "HUB_TOKENIZER",
    "C4DataModule",
    "ChatTemplate",
    "LIMADataModule",
    "PackedWindows",
    "ResumableLoader",
    "SpecialTokens",
    "collate_sft",
    "encode_conversation",
    "load_tokenizer",
    "parse_row",
    "read_documents",
    "render_chat",
]

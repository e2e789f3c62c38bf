"""The chat template, in one place: how a conversation becomes text, for SFT (``LIMADataModule``, which
also needs to know which pieces are supervised) and for evaluation (``BHyTLM.apply_chat_template``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bhyt_pl.data.tokenizer import BOS, END_HEADER, EOT, START_HEADER

__all__ = ["ROLES", "ChatTemplate", "chat_segments", "render_chat"]

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """How a conversation becomes text; the default is Llama-3's::

        <|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n{prompt}<|eot_id|>
        <|start_header_id|>assistant<|end_header_id|>\\n\\n{response}<|eot_id|>

    (no newline between turns). Only each assistant turn's ``{response}<|eot_id|>`` is supervised.
    Special-token strings are recognised by the tokenizer as single tokens.
    """

    prefix: str = BOS
    """Text before the first turn."""
    header: str = f"{START_HEADER}{{role}}{END_HEADER}\n\n"
    """Text before each turn's content; ``{role}`` is ``user`` or ``assistant``."""
    suffix: str = EOT
    """Text after each turn's content (supervised after an assistant turn: the model learns to stop)."""
    system: str | None = None
    """Optional system prompt, rendered as a first ``system`` turn."""


def chat_segments(
    messages: Sequence[dict[str, str]],
    template: ChatTemplate = ChatTemplate(),
    add_generation_prompt: bool = False,
    open_final: bool = False,
) -> list[tuple[str, bool]]:
    """The text of a conversation as ``(piece, is_assistant_content)`` pairs, in order.

    Args:
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
        template: the template; its ``system`` prompt comes first unless the messages start with one.
        add_generation_prompt: end with an open assistant header (the model answers next).
        open_final: leave a final assistant message without ``suffix``, so the model continues it
            (lm-eval's ``gen_prefix``).

    Returns:
        The template prefix, then per message its header and its content (+ suffix); the content piece
        of an assistant message is flagged (what SFT supervises).
    """
    segments: list[tuple[str, bool]] = [(template.prefix, False)]
    if template.system is not None and not (messages and messages[0]["role"] == "system"):
        segments.append((template.header.format(role="system") + template.system + template.suffix, False))
    for i, message in enumerate(messages):
        role = message["role"]
        if role not in ROLES:
            raise ValueError(f"chat role must be one of {', '.join(ROLES)}; got {role!r}")
        is_open = open_final and i == len(messages) - 1 and role == "assistant"
        segments.append((template.header.format(role=role), False))
        segments.append((message["content"] + ("" if is_open else template.suffix), role == "assistant"))
    if add_generation_prompt:
        segments.append((template.header.format(role="assistant"), False))
    return segments


def render_chat(
    messages: Sequence[dict[str, str]], template: ChatTemplate = ChatTemplate(), add_generation_prompt: bool = True
) -> str:
    """Render ``[{"role", "content"}, ...]`` with the chat template the LIMA data module trains with.

    ``add_generation_prompt`` appends an open assistant header; without it a final assistant message is
    left open (no ``suffix``), so the model continues it (lm-eval's ``gen_prefix``).
    """
    return "".join(
        text for text, _ in chat_segments(messages, template, add_generation_prompt, not add_generation_prompt)
    )

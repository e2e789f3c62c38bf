"""The one chat template: the pieces SFT supervises and what evaluation renders are the same text."""

from __future__ import annotations

import pytest

from bhyt_pl.data.chat import ChatTemplate, chat_segments, render_chat

BOS, SH, EH, EOT = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"


def test_segments_flag_assistant_content_and_render_the_llama3_text() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    segments = chat_segments(messages, ChatTemplate(system="Be brief."))
    assert segments == [
        (BOS, False),
        (f"{SH}system{EH}\n\nBe brief.{EOT}", False),
        (f"{SH}user{EH}\n\n", False),
        (f"Hi{EOT}", False),
        (f"{SH}assistant{EH}\n\n", False),
        (f"Hello{EOT}", True),
    ]
    prompt = render_chat(messages[:1], ChatTemplate(), add_generation_prompt=True)
    assert prompt == f"{BOS}{SH}user{EH}\n\nHi{EOT}{SH}assistant{EH}\n\n"
    assert render_chat(messages, ChatTemplate(), add_generation_prompt=False) == prompt + "Hello"  # left open


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="chat role must be one of system, user, assistant; got 'tool'"):
        render_chat([{"role": "tool", "content": "x"}])

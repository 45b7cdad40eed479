from __future__ import annotations

import pytest

from tokenomy.generation import last_user_text, message_dicts

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]


def test_last_user_text() -> None:
    assert last_user_text(MSGS) == "What is 2+2?"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert last_user_text(parts) == "a\nb"
    assert last_user_text([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]) is None
    assert last_user_text(MSGS + [{"role": "assistant", "content": "4"}]) is None
    assert last_user_text([{"role": "user", "content": "   "}]) is None
    assert last_user_text([]) is None


def test_last_user_text_anywhere_for_routing() -> None:
    convo = MSGS + [{"role": "assistant", "content": "4"}, {"role": "tool", "content": "x", "tool_call_id": "1"}]
    assert last_user_text(convo) is None  # the cache answers only a final user question
    assert last_user_text(convo, final=False) == "What is 2+2?"  # rules look at the last user turn anywhere
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert last_user_text(parts, final=False) == "a\nb"  # text parts joined, never the list's repr
    assert last_user_text([{"role": "system", "content": "s"}], final=False) is None


def test_message_dicts_refuses_what_is_not_a_message_list() -> None:
    with pytest.raises(TypeError, match="list of message objects"):
        message_dicts("hello")
    with pytest.raises(TypeError, match=r"messages\[1\]"):
        message_dicts([{"role": "user"}, 3])


"""Reading chat messages (OpenAI ``messages`` lists): the shape checks and the text of a turn.

Shared by the response caches (what a question is) and routing (what a prompt says); neither owns it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def message_dicts(messages: Any) -> list[Mapping[str, Any]]:
    """``messages`` as a list of mappings (pydantic models dumped without None fields); raises TypeError when
    it is not a list of message objects."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise TypeError("messages must be a list of message objects")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) and not hasattr(m, "model_dump"):
            raise TypeError(f"messages[{i}] is not an object")
    return [m if isinstance(m, Mapping) else m.model_dump(exclude_none=True) for m in messages]


def message_text(message: Mapping[str, Any]) -> str | None:
    """The text of a message: a string content, or the text parts of a content list joined by newlines.

    Returns None when the content holds anything but text (images, audio): such a turn cannot be embedded.
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and content:
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def last_user_text(messages: Sequence[Mapping[str, Any]], *, final: bool = True) -> str | None:
    """The text of the last user message (see ``message_text``), or None when there is none.

    ``final=True`` (the semantic cache): only when the conversation ends with that message and its text is not
    blank. A conversation that ends with a tool result or an assistant prefill is not a question the cache can
    answer, so it gets None and is served uncached. ``final=False`` (routing rules): the last user message
    wherever it is. The caller picks its own fallback for None.
    """
    msgs = message_dicts(messages)
    if final:
        if not msgs or msgs[-1].get("role") != "user":
            return None
        text = message_text(msgs[-1])
        return text if text and text.strip() else None
    for m in reversed(msgs):
        if m.get("role") == "user":
            return message_text(m)
    return None

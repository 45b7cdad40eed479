"""OpenAI's Conversations API bodies (`/v1/conversations`, its items) and what a response that names a
`conversation` reads from it and adds to it (api/conversations.py serves them).

A conversation is a list of Responses items. A response created with `conversation` reads the items as the
input before its own (as internal messages, exactly as a request's own `input` items are read,
dialect/responses.py), and then the conversation gains that input and the response's output items.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenomy.dialect.responses import MAX_METADATA, ResponsesRequest, items_with_ids

MAX_ITEMS = 20   # items one create may add (OpenAI's limit)


def _metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    if v is not None:
        if len(v) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} metadata pairs are allowed")
        if any(len(k) > 64 or len(x) > 512 for k, x in v.items()):
            raise ValueError("metadata keys are at most 64 characters and values at most 512")
    return v


class _ConversationBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ConversationCreate(_ConversationBody):
    items: list[dict[str, Any]] | None = Field(None, max_length=MAX_ITEMS)
    metadata: dict[str, str] | None = None

    _check_metadata = field_validator("metadata")(_metadata)


class ConversationUpdate(_ConversationBody):
    metadata: dict[str, str]

    _check_metadata = field_validator("metadata")(_metadata)


class ItemsCreate(_ConversationBody):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS)


def checked_items(items: list[dict[str, Any]], new_id: Any) -> list[dict[str, Any]]:
    """`items` as a conversation keeps them (ids given where missing); APIError 400 naming an item the model
    could not read, exactly as in a request's `input`."""
    if items:
        ResponsesRequest(model="-", input=items).input_messages()
    return items_with_ids(items, new_id)


def history(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation's items as the internal messages a response reads before its own input."""
    return ResponsesRequest(model="-", input=items).input_messages() if items else []

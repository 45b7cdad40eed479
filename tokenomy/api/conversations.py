"""OpenAI's Conversations API, so the official client's `client.conversations` works unchanged (docs/api.md):

    POST /v1/conversations    GET|POST|DELETE /v1/conversations/{id}
    GET|POST /v1/conversations/{id}/items    GET|DELETE /v1/conversations/{id}/items/{item_id}

and `conversation` on a response (api/responses.py calls `conversation_history` before and `extend` after).
Conversations are stored per tenant in the ledger's database (ledger/conversations_store.py): another tenant's id
is a 404, as for one that never existed. Served only with a ledger, as stored responses are; the app holds a
ConversationsAPI as `app.state.conversations`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute

from tokenomy.api import openapi
from tokenomy.dialect.conversations import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    checked_items,
    history,
)
from tokenomy.dialect.responses import ResponsesRequest
from tokenomy.dialect.responses_wire import new_id
from tokenomy.errors import APIError
from tokenomy.ledger.conversations_store import ConversationStore, StoredConversation

log = logging.getLogger("tokenomy")
API = "conversations"


@dataclass(frozen=True)
class ConversationsAPI:
    """What the routes read from `app.state.conversations`: the store (None without a ledger), `parse(request,
    model, api)` (authenticates, reads and validates a body) and `owner_of(request)`, (key id, tenant)."""

    store: ConversationStore | None
    parse: Callable[[Request, type[Any], str], Awaitable[Any]]
    owner_of: Callable[[Request], tuple[str, str]]


def _api(request: Request) -> tuple[ConversationStore, str]:
    api: ConversationsAPI = request.app.state.conversations
    assert api.store is not None
    return api.store, api.owner_of(request)[1]


def _not_found(conversation_id: str) -> APIError:
    return APIError(404, f"Conversation with id '{conversation_id}' not found.", param="conversation_id",
                    code="not_found")


async def _body(request: Request, model: type[Any]) -> Any:
    api: ConversationsAPI = request.app.state.conversations
    return await api.parse(request, model, API)


async def _owned(request: Request, conversation_id: str) -> tuple[ConversationStore, StoredConversation]:
    store, tenant = _api(request)
    found = await asyncio.to_thread(store.get, conversation_id, tenant)
    if found is None:
        raise _not_found(conversation_id)
    return store, found


async def create_conversation(request: Request) -> dict[str, Any]:
    body = await _body(request, ConversationCreate)
    store, tenant = _api(request)
    items = checked_items(body.items or [], new_id)
    conv = StoredConversation(new_id("conv_"), tenant, int(time.time()), body.metadata or {})
    await asyncio.to_thread(store.create, conv, items)
    return conv.body()


async def get_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    return (await _owned(request, conversation_id))[1].body()


async def update_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    body = await _body(request, ConversationUpdate)
    store, found = await _owned(request, conversation_id)
    await asyncio.to_thread(store.update, found.id, found.tenant, body.metadata)
    found.metadata = body.metadata
    return found.body()


async def delete_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    store, found = await _owned(request, conversation_id)
    await asyncio.to_thread(store.delete, found.id, found.tenant)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def _page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc.", param="order", code="invalid_value")
    if not 1 <= limit <= 100:
        raise APIError(400, "limit must be from 1 to 100.", param="limit", code="invalid_value")
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


async def list_items(conversation_id: str, request: Request, limit: int = 20, order: str = "desc",
                     after: str | None = None) -> dict[str, Any]:
    store, tenant = _api(request)
    items = await asyncio.to_thread(store.items, conversation_id, tenant)
    if items is None:
        raise _not_found(conversation_id)
    return _page(items, limit, order, after)


async def create_items(conversation_id: str, request: Request) -> dict[str, Any]:
    body = await _body(request, ItemsCreate)
    store, tenant = _api(request)
    items = checked_items(body.items, new_id)
    if not await asyncio.to_thread(store.add_items, conversation_id, tenant, items):
        raise _not_found(conversation_id)
    return {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"],
            "has_more": False}


async def get_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    store, tenant = _api(request)
    items = await asyncio.to_thread(store.items, conversation_id, tenant)
    if items is None:
        raise _not_found(conversation_id)
    for item in items:
        if item.get("id") == item_id:
            return item
    raise APIError(404, f"Item with id '{item_id}' not found.", param="item_id", code="not_found")


async def delete_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    store, found = await _owned(request, conversation_id)
    if not await asyncio.to_thread(store.delete_item, found.id, found.tenant, item_id):
        raise APIError(404, f"Item with id '{item_id}' not found.", param="item_id", code="not_found")
    return found.body()


# ---- `conversation` on a response ---------------------------------------------------------------------------
def conversation_id(body: ResponsesRequest) -> str | None:
    conv = body.conversation
    return conv if isinstance(conv, str) or conv is None else conv.get("id")


async def conversation_history(request: Request, body: ResponsesRequest, tenant: str) -> list[dict[str, Any]]:
    """The internal messages of the conversation `body` names ([] without one); 404 for one this tenant does not
    have, 400 when there is no store."""
    conv = conversation_id(body)
    if conv is None:
        return []
    api: ConversationsAPI | None = getattr(request.app.state, "conversations", None)
    if api is None or api.store is None:
        raise APIError(400, "conversation needs stored conversations, and this tokenomy runs without a ledger "
                       "(ledger: null); send the whole conversation as input instead.", param="conversation",
                       code="store_unavailable")
    if not isinstance(conv, str):
        raise APIError(400, "conversation must be a conversation id or {\"id\": ...}", param="conversation",
                       code="invalid_value")
    items = await asyncio.to_thread(api.store.items, conv, tenant)
    if items is None:
        raise APIError(404, f"Conversation with id '{conv}' not found.", param="conversation", code="not_found")
    return history(items)


async def extend(request: Request, body: ResponsesRequest, tenant: str, input_items: list[dict[str, Any]],
                 response: dict[str, Any]) -> None:
    """Add a finished response's input and output items to the conversation it named (nothing without one); a
    database that refuses them costs the next turn, not this answer."""
    conv = conversation_id(body)
    api: ConversationsAPI | None = getattr(request.app.state, "conversations", None)
    if conv is None or api is None or api.store is None:
        return
    try:
        await asyncio.to_thread(api.store.add_items, conv, tenant, input_items + list(response["output"]))
    except Exception:
        log.exception("conversations: %s not extended by %s", conv, response.get("id"))


ROUTES = [
    APIRoute("/v1/conversations", create_conversation, methods=["POST"],
             openapi_extra=openapi.documented(ConversationCreate)),
    APIRoute("/v1/conversations/{conversation_id}", get_conversation, methods=["GET"]),
    APIRoute("/v1/conversations/{conversation_id}", update_conversation, methods=["POST"],
             openapi_extra=openapi.documented(ConversationUpdate)),
    APIRoute("/v1/conversations/{conversation_id}", delete_conversation, methods=["DELETE"]),
    APIRoute("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    APIRoute("/v1/conversations/{conversation_id}/items", create_items, methods=["POST"],
             openapi_extra=openapi.documented(ItemsCreate)),
    APIRoute("/v1/conversations/{conversation_id}/items/{item_id}", get_item, methods=["GET"]),
    APIRoute("/v1/conversations/{conversation_id}/items/{item_id}", delete_item, methods=["DELETE"]),
]

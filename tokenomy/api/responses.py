"""OpenAI's Responses API routes, so the official client's `client.responses` and Codex work unchanged
(docs/api.md, "OpenAI Responses"):

    POST /v1/responses    GET /v1/responses/{id}    DELETE /v1/responses/{id}    GET /v1/responses/{id}/input_items

A response runs through the same pipeline as a chat completion (dialect/responses.py maps it); serve.py runs and
streams it. With a store (the gateway keeps a ledger), an answer is stored unless `store: false`, and a later
request continues it by `previous_response_id`: its stored conversation goes before the new input, so the prompt
renders the same prefix as the turn before and the engine's prefix cache serves it. A stored response is its
tenant's: any other tenant gets a 404, as for an id that never existed. A request that names a `conversation`
reads its items first and adds its input and output to it (api/conversations.py); `POST /v1/responses/compact`
is api/compact.py. The app holds a ResponsesAPI as
`app.state.responses`; POST is always served, the other routes (ROUTES_STORED) only with a store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from tokenomy.api import conversations, openapi
from tokenomy.api import run as serve
from tokenomy.api.error_bodies import error_response
from tokenomy.dialect.responses import ResponsesRequest, assistant_message, input_items
from tokenomy.dialect.responses_wire import ResponseEvents, final_body, new_id
from tokenomy.errors import APIError
from tokenomy.ledger.responses_store import ResponseStore, StoredResponse

log = logging.getLogger("tokenomy")
API = "responses"


@dataclass(frozen=True)
class ResponsesAPI:
    """What the routes read from `app.state.responses`: the store (None without a ledger), `parse(request,
    model, api)`, which authenticates, reads and validates a body (a refused one still gets its ledger row), and
    `owner_of(request)`, the caller's (key id, tenant)."""

    store: ResponseStore | None
    parse: Callable[[Request, type[ResponsesRequest], str], Awaitable[Any]]
    owner_of: Callable[[Request], tuple[str, str]]


def responses_api(request: Request) -> ResponsesAPI:
    api: ResponsesAPI = request.app.state.responses
    return api


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


async def create_response(request: Request) -> Response:
    api, gateway = responses_api(request), request.app.state.gateway
    body = await api.parse(request, ResponsesRequest, API)
    assert isinstance(body, ResponsesRequest)
    key_id, tenant = api.owner_of(request)
    try:
        history = await history_of(api, body, tenant) + await conversations.conversation_history(request, body,
                                                                                                  tenant)
        gen = body.gen_request(history)
    except APIError as e:
        gateway.refused(API, e, serve.headers_of(request))
        raise
    store = api.store if body.wants_store(api.store is not None) else None
    try:
        ctx = await serve.run(request, gateway, gen, body.stream)
    except serve.ClientLeft:
        return serve.client_left()
    except APIError as e:
        return error_response(e)

    items = input_items(body, new_id)

    def stored(obj: dict[str, Any], text: str, calls: list[dict[str, Any]] | None) -> StoredResponse:
        return StoredResponse(id=obj["id"], ts=time.time(), tenant=tenant, key_id=key_id or None,
                              request_id=ctx.request_id,
                              conversation=history + body.input_messages() + [assistant_message(text, calls)],
                              input_items=items, response=obj)

    if not body.stream:
        obj = final_body(ctx, body, store is not None)
        if store is not None:
            assert ctx.result is not None
            await _put(store, stored(obj, ctx.result.text, ctx.result.tool_calls))
        await conversations.extend(request, body, tenant, items, obj)
        return JSONResponse(obj, headers=serve.tokenomy_headers(ctx, with_cost=True))
    events = ResponseEvents(ctx, body, store is not None)

    async def end() -> list[bytes]:
        obj = events.body()
        if store is not None:
            await _put(store, stored(obj, events.text, events.tool_calls))
        await conversations.extend(request, body, tenant, items, obj)
        return events.end()

    return serve.stream_response(ctx, events.chunks, end)


async def history_of(api: ResponsesAPI, body: ResponsesRequest, tenant: str) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` continues ([] without one); 404 for an id this tenant has
    not stored, 400 when nothing can be stored (no ledger)."""
    if body.previous_response_id is None:
        return []
    if api.store is None:
        raise APIError(400, "previous_response_id needs stored responses, and this tokenomy runs without a ledger "
                       "(ledger: null); send the whole conversation as input instead.",
                       param="previous_response_id", code="store_unavailable")
    prior = await asyncio.to_thread(api.store.get, body.previous_response_id, tenant)
    if prior is None:
        raise APIError(404, f"Previous response with id '{body.previous_response_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    return prior.conversation


async def _put(store: ResponseStore, stored: StoredResponse) -> None:
    """Store an answer off the event loop; a database that refuses it costs the next turn, not this answer."""
    try:
        await asyncio.to_thread(store.put, stored)
    except Exception:
        log.exception("responses: %s not stored", stored.id)


async def _owned(request: Request, response_id: str) -> tuple[ResponseStore, StoredResponse]:
    api = responses_api(request)
    assert api.store is not None
    _, tenant = api.owner_of(request)
    found = await asyncio.to_thread(api.store.get, response_id, tenant)
    if found is None:
        raise _not_found(response_id)
    return api.store, found


async def get_response(response_id: str, request: Request, stream: bool = False) -> dict[str, Any]:
    if stream:
        raise APIError(400, "Replaying a stored response as a stream is not supported; omit stream.",
                       param="stream", code="unsupported_parameter")
    _, found = await _owned(request, response_id)
    return found.response


async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    store, found = await _owned(request, response_id)
    await asyncio.to_thread(store.delete, found.id, found.tenant)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def list_input_items(response_id: str, request: Request, limit: int = 20, order: str = "desc",
                           after: str | None = None) -> dict[str, Any]:
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc.", param="order", code="invalid_value")
    if not 1 <= limit <= 100:
        raise APIError(400, "limit must be from 1 to 100.", param="limit", code="invalid_value")
    _, found = await _owned(request, response_id)
    items = found.input_items if order == "asc" else found.input_items[::-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


ROUTES = [APIRoute("/v1/responses", create_response, methods=["POST"],
                   openapi_extra=openapi.documented(ResponsesRequest))]
ROUTES_STORED = [
    APIRoute("/v1/responses/{response_id}", get_response, methods=["GET"]),
    APIRoute("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    APIRoute("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
]

"""WebSocket mode of the Responses API: one long-lived socket on `/v1/responses` (the openai SDK's
`client.beta.responses.connect()`), docs/api.md, "WebSocket mode".

The client sends `{"type": "response.create", ...}` messages whose other fields are a `POST /v1/responses` body;
every event of the answer comes back as one text message, the same events as the HTTP stream (`stream` is implied
and ignored), with the message's `stream_id` echoed when it has one. Turns are served one at a time, in the order
they arrive; each is its own request through the same pipeline as HTTP: its key is looked up again (a key revoked
or reloaded away mid-socket refuses the next turn), its rate windows and budgets are admitted, and it writes one
ledger row (a turn refused before the pipeline gets its row through `gateway.refused`, as an HTTP body that cannot
be read does).

The socket keeps its last response in memory: a turn whose `previous_response_id` names it continues its
conversation with or without `store` (a stored response is found in the response store as over HTTP; one neither
in memory nor stored is an `error` event, `previous_response_not_found`, status 400). A turn that fails (an
`error` event or `response.failed`) evicts the response it would have continued, so that nothing continues from
a state the client never saw succeed. Closing the socket drops its memory and stops a turn in flight; after a
reconnect only stored responses can be continued (OpenAI's reconnect semantics).

Keeping the chain's KV warm: the model the chain's last turn ran on is held loaded in the fleet while the socket is
open (Fleet.hold: neither evicted for another model nor unloaded by its keep_alive; placement still counts it), so
the chain's KV stays in that engine. Each turn asks the engine to keep its prompt's and answer's KV pinned for
server.socket_pin_s after it ends (GenRequest.pin_s): the next turn's prompt is that plus the new input, so it
continues in place; other traffic evicts every unpinned cached prefix before a pinned one
(tokenomy/engine/kv/prefix_cache.py), so the pin never refuses live work, and an evicted one goes to the RAM KV
tier and is restored from there. A pin lapses on its own after the socket closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tokenomy.api.responses import API, ResponsesAPI
from tokenomy.api.run import tokenomy_headers
from tokenomy.dialect import json_input
from tokenomy.dialect.responses import ResponsesRequest, assistant_message, input_items
from tokenomy.dialect.responses_wire import ResponseEvents, new_id
from tokenomy.errors import APIError
from tokenomy.ledger.responses_store import StoredResponse
from tokenomy.pipeline.request import RequestContext

log = logging.getLogger("tokenomy")
POLICY_VIOLATION = 1008          # the WebSocket close code for a refused upgrade where no HTTP answer can be sent
# fields of a response.create message that are not a body field, or that WebSocket mode fixes itself
NOT_BODY = ("type", "stream", "stream_id", "stream_options")


@dataclass
class Chain:
    """The socket's in-memory state: its last response and the conversation that continues it."""

    response_id: str
    conversation: list[dict[str, Any]]


@dataclass
class Socket:
    """One open socket: its request headers (lower-cased, the Authorization header of the upgrade among them) and
    its last response."""

    headers: dict[str, str]
    last: Chain | None = None
    turns: int = 0
    opened: float = field(default_factory=time.time)
    held: str | None = None     # the fleet model its chain's last turn ran on, held loaded while the socket is open

    def hold(self, gateway: Any, model: str | None) -> None:
        """Hold `model` in the gateway's fleet for this socket (and let go of the one held before)."""
        fleet = gateway.fleet
        if fleet is None or model == self.held:
            return
        if self.held is not None:
            fleet.unhold(self.held)
        self.held = model if model is not None and fleet.hold(model) else None

    def evict(self, response_id: str | None) -> None:
        if response_id is not None and self.last is not None and self.last.response_id == response_id:
            self.last = None


class SocketEvents(ResponseEvents):
    """The HTTP stream's events, each one WebSocket message: the event's JSON, `stream_id` added when the
    response.create carried one."""

    def __init__(self, ctx: RequestContext, body: ResponsesRequest, stored: bool, stream_id: str | None) -> None:
        super().__init__(ctx, body, stored)
        self.stream_id = stream_id

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        self.seq += 1
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def error_event(err: APIError, stream_id: str | None = None, headers: dict[str, str] | None = None
                ) -> dict[str, Any]:
    """The `error` message of a turn refused before its stream began: OpenAI's error object and the HTTP status it
    would have had (with the headers it would have carried: Retry-After, x-tokenomy-*)."""
    event: dict[str, Any] = {"type": "error", "status": err.status, "error": dict(err.body()["error"])}
    merged = {**(headers or {}), **err.headers}
    if merged:
        event["error"]["headers"] = merged
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


async def responses_socket(websocket: WebSocket) -> None:
    """`/v1/responses` over a WebSocket: authenticate the upgrade (401 as an HTTP answer where the server allows
    it, else a close with 1008), then serve each message as a turn until the client closes."""
    gateway = websocket.app.state.gateway
    headers = {k.lower(): v for k, v in websocket.headers.items()}
    if gateway.keyring.enabled:
        try:
            gateway.keyring.lookup(headers.get("authorization"))
        except APIError as e:
            await _deny(websocket, e)
            return
    await websocket.accept()
    socket = Socket(headers)
    inbox: asyncio.Queue[str] = asyncio.Queue()
    worker = asyncio.ensure_future(_serve_turns(websocket, socket, inbox))
    try:
        while not worker.done():
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", errors="replace")
            inbox.put_nowait(text)
    finally:        # the client left: a turn in flight is cancelled, which closes its deltas and stops the engine
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        socket.hold(gateway, None)


async def _deny(websocket: WebSocket, err: APIError) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(err.body(), status_code=err.status, headers=err.headers))
    else:
        await websocket.close(code=POLICY_VIOLATION, reason=err.message[:120])


async def _serve_turns(websocket: WebSocket, socket: Socket, inbox: asyncio.Queue[str]) -> None:
    try:
        while True:
            text = await inbox.get()
            for message in await _turn(websocket, socket, text):
                await websocket.send_text(message)
    except (WebSocketDisconnect, RuntimeError):     # sending to a socket the client closed
        return


async def _turn(websocket: WebSocket, socket: Socket, text: str) -> list[str]:
    """Serve one message. Events of the answer are sent as they come; what is returned is sent after (an
    `error` event for a turn refused before its stream began)."""
    app = websocket.app
    gateway, api = app.state.gateway, app.state.responses
    assert isinstance(api, ResponsesAPI)
    socket.turns += 1
    stream_id: str | None = None
    body: ResponsesRequest | None = None
    try:
        event = _message(text, gateway.config.server.max_body_bytes)
        stream_id = event.get("stream_id") if isinstance(event.get("stream_id"), str) else None
        info = gateway.keyring.lookup(socket.headers.get("authorization")) if gateway.keyring.enabled else None
        key_id, tenant = (info.key_id, info.tenant) if info is not None else ("", "default")
        body = _body(event)
        history = await _history(api, socket, body, tenant)
        gen = body.gen_request(history)
        gen.pin_s = gateway.config.server.socket_pin_s
    except APIError as e:
        gateway.refused(API, e, socket.headers)
        if body is not None:
            socket.evict(body.previous_response_id)
        return [json.dumps(error_event(e, stream_id))]
    store = api.store if body.wants_store(api.store is not None) else None
    ctx = RequestContext(gen=gen, stream=True, headers=dict(socket.headers), key=info)
    try:
        await gateway.handle(ctx)
    except APIError as e:
        socket.evict(body.previous_response_id)
        return [json.dumps(error_event(e, stream_id, tokenomy_headers(ctx)))]
    events = SocketEvents(ctx, body, store is not None, stream_id)
    deltas = ctx.deltas
    assert deltas is not None
    failed = False
    try:
        async for d in deltas:
            for chunk in events.chunks(d):
                await websocket.send_text(chunk.decode())
            if d.error:
                failed = True
                break
    finally:
        await deltas.aclose()
    if failed:
        socket.evict(body.previous_response_id)
        return []
    obj = events.body()
    conversation = history + body.input_messages() + [assistant_message(events.text, events.tool_calls)]
    socket.last = Chain(obj["id"], conversation)
    socket.hold(gateway, ctx.model)
    if store is not None:
        stored = StoredResponse(id=obj["id"], ts=time.time(), tenant=tenant, key_id=key_id or None,
                                request_id=ctx.request_id, conversation=conversation,
                                input_items=input_items(body, new_id), response=obj)
        try:
            await asyncio.to_thread(store.put, stored)
        except Exception:
            log.exception("responses: %s not stored", stored.id)
    return [chunk.decode() for chunk in events.end()]


def _message(text: str, limit: int) -> dict[str, Any]:
    """A client message as a `response.create` event, or a 400 that says what is wrong with it."""
    if len(text) > limit:
        raise APIError(413, f"The message is {len(text)} characters; the limit is {limit}.", code="body_too_large")
    event = json_input.loads(text, "The message's JSON")
    if not isinstance(event, dict):
        raise APIError(400, "A message must be a JSON object.", code="invalid_body")
    kind = event.get("type")
    if kind != "response.create":
        raise APIError(400, f"Unsupported event type {kind!r}: tokenomy's WebSocket mode serves response.create "
                       "events only.", param="type", code="unsupported_event_type")
    return event


def _body(event: dict[str, Any]) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate({k: v for k, v in event.items() if k not in NOT_BODY})
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                       code="invalid_value") from None


async def _history(api: ResponsesAPI, socket: Socket, body: ResponsesRequest, tenant: str) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues: the socket's last response, else a stored one of the
    tenant's; a 400 `previous_response_not_found` for neither."""
    prior = body.previous_response_id
    if prior is None:
        return []
    if socket.last is not None and socket.last.response_id == prior:
        return list(socket.last.conversation)
    found = await asyncio.to_thread(api.store.get, prior, tenant) if api.store is not None else None
    if found is None:
        raise APIError(400, f"Previous response with id '{prior}' not found: this socket holds only its last "
                       "response, and stored responses (store: true) are found after a reconnect.",
                       param="previous_response_id", code="previous_response_not_found")
    return found.conversation


ROUTES = [WebSocketRoute("/v1/responses", responses_socket)]

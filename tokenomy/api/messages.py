"""The Anthropic Messages surface: `POST /v1/messages` (served through the same pipeline as chat completions) and
`POST /v1/messages/count_tokens`, and Anthropic's shape of `/v1/models` for its SDK's models.list.

A key comes as `x-api-key` or `Authorization: Bearer`; the pipeline reads keys from `authorization`, so an
`x-api-key` is presented there as the bearer key (the same lookup, the same refusals). `anthropic-version`,
`anthropic-beta` and `?beta=true` are accepted and change nothing.

A stream answers with its HTTP status while the pipeline decides (keys, limits, the body, the model, the
engine's own checks: milliseconds); once the first token has taken FIRST_EVENT_S, the stream starts anyway with
message_start and sends a ping every PING_S until it comes, as a long prefill can take a minute on a CPU. A
failure after that is an `event: error` in the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from tokenomy.api import openapi
from tokenomy.api import run as serve
from tokenomy.api.body import read_json
from tokenomy.api.error_bodies import messages_error_response
from tokenomy.backends.base import InvalidRequest
from tokenomy.dialect.messages import CountTokensRequest, MessagesRequest, body_error
from tokenomy.dialect.messages_wire import PING, EventWriter, error_event, message_body
from tokenomy.errors import APIError
from tokenomy.gateway import Gateway
from tokenomy.pipeline.request import RequestContext

API = "messages"
FIRST_EVENT_S = 1.0     # a stream starts (message_start) when its first token is not ready by then ...
PING_S = 5.0            # ... and pings this often until it is
WATCH_S = 0.05          # how often a request still before its model is looked at after FIRST_EVENT_S


async def create_message(request: Request) -> Response:
    gateway = _gateway(request)
    headers = key_headers(request)
    try:
        body = await _parse(gateway, request, MessagesRequest, headers)
    except APIError as e:
        gateway.refused(API, e, headers)
        return messages_error_response(e)
    assert isinstance(body, MessagesRequest)
    gen = body.gen_request()
    if not body.stream:
        try:
            ctx = await serve.run(request, gateway, gen, False, headers)
        except serve.ClientLeft:
            return serve.client_left()
        except APIError as e:
            return messages_error_response(e)
        return JSONResponse(message_body(ctx), headers={**serve.tokenomy_headers(ctx, with_cost=True),
                                                        "request-id": ctx.request_id})
    return await _stream(request, gateway, RequestContext(gen=gen, stream=True, headers=headers))


async def count_tokens(request: Request) -> JSONResponse:
    """The prompt's tokens as the model that would serve it first counts them (the context stage's count: the
    rendered template with the tools), for the key's allowed models only. Nothing is generated and no ledger
    row is written."""
    gateway = _gateway(request)
    headers = key_headers(request)
    body = await _parse(gateway, request, CountTokensRequest, headers)
    assert isinstance(body, CountTokensRequest)
    if gateway.keyring.enabled:
        allowed = gateway.keyring.lookup(headers.get("authorization")).allowed
        if allowed is not None and body.model not in allowed:
            raise APIError(403, f"This key may not use the model '{body.model}'. It may use: "
                           f"{', '.join(sorted(allowed))}.", param="model", code="model_not_allowed")
    route = gateway.routes.get(body.model)
    target = route.models[0] if route is not None else body.model
    if target not in gateway.registry:
        raise APIError(404, f"The model '{body.model}' does not exist.", param="model", code="model_not_found")
    try:
        count = gateway.count_tokens(target, RequestContext(gen=body.gen_request(), headers=headers))
    except InvalidRequest as e:
        raise APIError(400, str(e), param=e.param, code=e.code) from e
    return JSONResponse({"input_tokens": count.tokens})


def models(request: Request) -> dict[str, Any]:
    """Anthropic's model list (asked with an `anthropic-version` header): one page, every name the key may use
    for messages (the packaged embedding model is no Messages model)."""
    gateway = _gateway(request)
    data = [{"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
            for name in gateway.models_for(key_headers(request).get("authorization"))
            if name not in gateway.packaged_embedders]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def model(model_id: str, request: Request) -> dict[str, Any]:
    if model_id not in _gateway(request).models_for(key_headers(request).get("authorization")):
        raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return {"type": "model", "id": model_id, "display_name": model_id, "created_at": "1970-01-01T00:00:00Z"}


def key_headers(request: Request) -> dict[str, str]:
    """The request's headers for the pipeline, lower-cased, with a key sent as `x-api-key` presented as the bearer
    key the admit stage reads (an `x-api-key` wins over an `authorization` header sent with it)."""
    headers = serve.headers_of(request)
    key = headers.get("x-api-key")
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers


async def _parse(gateway: Gateway, request: Request, cls: type[BaseModel], headers: dict[str, str]) -> BaseModel:
    """Authenticate (before a byte of the body is read), then read and validate the body."""
    if gateway.keyring.enabled:
        try:
            gateway.keyring.lookup(headers.get("authorization"))
        except APIError as e:
            if e.code == "missing_api_key":
                e.message = "You didn't provide an API key. Send it in the x-api-key header."
            raise
    data = await read_json(request, gateway.config.server.max_body_bytes)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise body_error(e.errors()) from None


async def _stream(request: Request, gateway: Gateway, ctx: RequestContext) -> Response:
    """Wait for the pipeline: an error before the first token is an HTTP error and a first token is streamed; a
    request that has reached its model (every stage before generate passed, and the engine took it: `serving`)
    without a first token after FIRST_EVENT_S starts its stream now and pings while the pipeline goes on."""
    run = asyncio.ensure_future(serve.run_context(request, gateway, ctx))
    loop = asyncio.get_running_loop()
    start_at = loop.time() + FIRST_EVENT_S
    try:
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(run), max(start_at - loop.time(), WATCH_S))
                break
            except TimeoutError:
                if ctx.serving is not None and loop.time() >= start_at:
                    return _early(ctx, run)
    except serve.ClientLeft:
        return serve.client_left()
    except APIError as e:
        return messages_error_response(e)
    except BaseException:
        run.cancel()
        raise
    writer = EventWriter(ctx)
    response = serve.stream_response(ctx, writer.chunks, writer.end)
    response.headers["request-id"] = ctx.request_id
    return response


def _early(ctx: RequestContext, run: asyncio.Future[RequestContext]) -> StreamingResponse:
    """The stream of a request whose first token is still coming: message_start now, pings until the pipeline
    hands over its deltas (or fails: an error event), then the answer."""
    writer = EventWriter(ctx)

    async def events() -> AsyncIterator[bytes]:
        try:
            yield writer.start()
            while not (await asyncio.wait({run}, timeout=PING_S))[0]:
                yield PING
            try:
                run.result()
            except serve.ClientLeft:
                return
            except APIError as e:
                yield error_event(e)
                return
            assert ctx.deltas is not None
            async for d in ctx.deltas:
                for chunk in writer.chunks(d):
                    yield chunk
                if d.error:
                    return
            for chunk in writer.end():
                yield chunk
        finally:
            if not run.done():
                run.cancel()
            elif ctx.deltas is not None and not run.cancelled() and run.exception() is None:
                await ctx.deltas.aclose()           # closing the deltas stops the generation

    headers = {**serve.tokenomy_headers(ctx), "cache-control": "no-cache", "request-id": ctx.request_id}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


ROUTES = [
    APIRoute("/v1/messages", create_message, methods=["POST"], openapi_extra=openapi.documented(MessagesRequest)),
    APIRoute("/v1/messages/count_tokens", count_tokens, methods=["POST"],
             openapi_extra=openapi.documented(CountTokensRequest)),
]

"""Serving one generation over HTTP, for every dialect: run the pipeline while watching for the client leaving,
then hand the finished RequestContext to the dialect to render, or stream its deltas through the dialect's writer.

A dialect (OpenAI chat and completions in app.py, Messages, Responses, Ollama) only maps its body to a GenRequest
and its answer back; how a request is run, cancelled and streamed lives here once."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from tokenomy.errors import APIError
from tokenomy.generation import Delta, GenRequest
from tokenomy.pipeline.request import RequestContext

CLIENT_CLOSED = 499


class ClientLeft(Exception):
    """The client closed the connection before the answer was ready; the generation was stopped."""


def headers_of(request: Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


async def run(request: Request, gateway: object, gen: GenRequest, stream: bool,
              headers: dict[str, str] | None = None) -> RequestContext:
    """Run `gen` through the gateway's pipeline. Returns the context (with `result`, or `deltas` when streamed);
    raises ClientLeft when the client disconnects first (the work is cancelled), and APIError with the tokenomy
    headers merged into its own. `headers`: the request's as the pipeline should see them (lower-cased; a
    dialect may map its own key header into `authorization`), else the request's own."""
    if headers is None:     # the request's own: the key parse_recorded (api/body.py) checked is the one they hold
        ctx = RequestContext(gen=gen, stream=stream, headers=headers_of(request), key=request.scope.get("tokenomy.key"))
    else:
        ctx = RequestContext(gen=gen, stream=stream, headers=headers)
    return await run_context(request, gateway, ctx)


async def run_context(request: Request, gateway: object, ctx: RequestContext) -> RequestContext:
    """`run` for a context the caller made, which it may watch while the pipeline runs (a stream that must
    start before its first token, api/messages.py). The pipeline runs in the caller's task; a watcher cancels
    that task when the client disconnects, and the cancellation becomes ClientLeft."""
    task = asyncio.current_task()
    assert task is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await disconnected(request)
        left = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        await gateway.handle(ctx)  # type: ignore[attr-defined]
    except BaseException as e:
        if not left:                # (a CancelledError: the caller gave up on the answer, a stream that started)
            if isinstance(e, APIError):
                e.headers = {**tokenomy_headers(ctx), **e.headers}
            raise
    finally:
        watcher.cancel()
    if left:                        # the client left before the answer was ready: the work was stopped
        task.uncancel()
        raise ClientLeft
    return ctx


def tokenomy_headers(ctx: RequestContext, with_cost: bool = False) -> dict[str, str]:
    """The x-tokenomy-* headers every dialect's response carries: request id, cache outcome, route, cost."""
    h = {"x-tokenomy-request-id": ctx.request_id, "x-tokenomy-cache": ctx.cache}
    if with_cost and ctx.usage is not None and ctx.model and not ctx.stream:
        h["x-tokenomy-cost-usd"] = f"{ctx.cost_usd:.8f}"
    if ctx.model:
        h["x-tokenomy-route"] = f"{ctx.model}; {ctx.route_reason}"
    if ctx.usage is not None and ctx.usage.counted:
        h["x-tokenomy-usage"] = "counted"
    h.update(ctx.response_headers)
    return h


def stream_response(ctx: RequestContext, chunks: Callable[[Delta], Iterable[bytes]],
                    end: Callable[[], Iterable[bytes] | Awaitable[Iterable[bytes]]],
                    media_type: str = "text/event-stream") -> StreamingResponse:
    """An SSE response (or NDJSON: `media_type`) of `ctx.deltas`, each rendered by `chunks`; `end` closes a stream
    that ran to its finish (it may be a coroutine function, for a dialect that stores the answer before saying it is
    complete).
    An error delta is rendered by `chunks` too and ends the stream without `end` (which would claim a clean
    finish). Closing the response (the client left) closes the deltas, which stops the generation."""
    assert ctx.deltas is not None

    async def events() -> AsyncIterator[bytes]:
        deltas = ctx.deltas
        assert deltas is not None
        try:
            async for d in deltas:
                for chunk in chunks(d):
                    yield chunk
                if d.error:
                    return
            tail = end()
            if inspect.isawaitable(tail):
                tail = await tail
            for chunk in tail:
                yield chunk
        finally:
            await deltas.aclose()

    return StreamingResponse(events(), media_type=media_type,
                             headers={**tokenomy_headers(ctx), "cache-control": "no-cache"})


def client_left() -> Response:
    return Response(status_code=CLIENT_CLOSED)


async def disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

"""The HTTP surface: translate OpenAI requests into a RequestContext, run the gateway, translate back.

Each endpoint is a module-level function that finds the Gateway as `app.state.gateway`; create_app assembles the
routes (ROUTES, the Responses API's, the Anthropic Messages routes, the embeddings', Ollama's, and the dashboard's
and the Files and Batches' when the gateway has them), the error handlers and the lifespan."""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokenomy.api import (
    admin,
    batches,
    compact,
    conversations,
    dashboard,
    embeddings,
    messages,
    ollama,
    openapi,
    responses,
    responses_socket,
)
from tokenomy.api import run as serve
from tokenomy.api.batches import BatchAPI
from tokenomy.api.body import parse_recorded
from tokenomy.api.dashboard import Dashboard
from tokenomy.api.error_bodies import (
    api_error_handler,
    error_response,
    http_error_handler,
    unhandled_handler,
    validation_handler,
)
from tokenomy.backends.fleet import Fleet, FleetFull
from tokenomy.dialect.chat import ChatCompletionRequest, CompletionRequest
from tokenomy.dialect.chat_wire import ChunkWriter, chat_body, completion_body
from tokenomy.errors import APIError
from tokenomy.gateway import Gateway
from tokenomy.generation import GenRequest
from tokenomy.hardware import gpu
from tokenomy.limits.auth_failures import AuthFailures


async def chat_completions(request: Request) -> Response:
    return await _generate(request, ChatCompletionRequest, "chat.completions")


async def completions(request: Request) -> Response:
    return await _generate(request, CompletionRequest, "completions")


async def _generate(request: Request, cls: type[ChatCompletionRequest] | type[CompletionRequest],
                    api: str) -> Response:
    """Read a body of `cls`, map it to the pipeline's request and serve it (a completion echoes its prompt when
    asked)."""
    gateway = _gateway(request)
    body = await parse_recorded(gateway, request, cls, api)
    assert isinstance(body, cls)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    echo = body.text if isinstance(body, CompletionRequest) and body.echo else ""
    return await _serve(request, gateway, body.gen_request(), body.stream, include_usage, echo=echo)


async def models(request: Request) -> dict[str, Any]:
    if "anthropic-version" in request.headers:      # Anthropic's SDK: its own list shape
        return messages.models(request)
    gateway = _gateway(request)
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "tokenomy", **gateway.window_source(name)}
        for name in gateway.models_for(request.headers.get("authorization"))]}


async def model(model_id: str, request: Request) -> dict[str, Any]:
    if "anthropic-version" in request.headers:
        return messages.model(model_id, request)
    if model_id not in _gateway(request).models_for(request.headers.get("authorization")):
        raise APIError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "tokenomy",
            **_gateway(request).window_source(model_id)}


async def health(request: Request) -> JSONResponse:
    gateway = _gateway(request)
    states = {n: await b.health() for n, b in gateway.registry.backends.items()}
    ok = any(states.values())
    engines = {n: e.describe() for n, e in gateway.engines()}
    cooling = sorted(n for n in states if gateway.registry.cooling(n))
    caches = {n: getattr(store, "healthy", True) for n, store in gateway.cache_stores()}
    status = "unavailable" if not ok else "degraded" if not all(caches.values()) or cooling else "ok"
    gpus = gpu.memory()       # None without an NVIDIA GPU (NVML)
    worker = {"worker": {"index": gateway.worker, "pid": os.getpid()}} if gateway.worker is not None else {}
    fleet = {"fleet": gateway.fleet.ps()} if gateway.fleet is not None else {}
    return JSONResponse({"status": status, "models": states, "engines": engines, "cooling": cooling,
                         "caches": caches, "gpu": None if gpus is None else [g.as_dict() for g in gpus], **worker,
                         **fleet}, status_code=200 if ok else 503)


def _fleet_model(request: Request, name: str) -> Fleet:
    _admin(request)
    fleet = _gateway(request).fleet
    if fleet is None:
        raise APIError(400, "models are not loaded on demand here (server.workers runs every engine)",
                       code="no_fleet")
    if name not in fleet.models:
        raise APIError(404, f"The model '{name}' is not an embedded model of this server", param="model",
                       code="model_not_found")
    return fleet


async def admin_models(request: Request) -> dict[str, Any]:
    """The ps view: every embedded model's state, memory (estimated and measured), idle time, keep-alive left,
    loads, evictions and load seconds, and the memory limit placement uses."""
    _admin(request)
    fleet = _gateway(request).fleet
    if fleet is None:
        raise APIError(400, "models are not loaded on demand here (server.workers runs every engine)",
                       code="no_fleet")
    return fleet.ps()


async def admin_load(name: str, request: Request) -> dict[str, Any]:
    """Load a model now (no-op when loaded); 503 with the figures when it cannot be placed or fails to load."""
    fleet = _fleet_model(request, name)
    try:
        m = await fleet.load(name)
    except FleetFull as e:
        raise APIError(503, str(e), code="model_not_loaded",
                       headers={"retry-after": str(max(1, math.ceil(e.retry_after or 1)))}) from e
    return m.describe(time.monotonic())


async def admin_unload(name: str, request: Request) -> dict[str, Any]:
    """Unload a model (its engine process ends); with requests running on it, when the last one ends."""
    fleet = _fleet_model(request, name)
    outcome = await fleet.unload(name)
    return {"model": name, "outcome": outcome}


async def metrics(request: Request) -> Response:
    """The Prometheus exposition; the per-tenant and per-key families (prometheus.PER_TENANT) only for an admin key,
    or for anyone with no keys configured or with server.metrics_per_tenant_public."""
    _keyed(request)
    gateway = _gateway(request)
    every = (not gateway.keyring.enabled or gateway.config.server.metrics_per_tenant_public
             or _admin_or_none(request))
    return Response(gateway.metrics.render(per_tenant=every), media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi_json(request: Request) -> JSONResponse:
    _keyed(request)
    return JSONResponse(request.app.openapi())


async def docs(request: Request) -> Response:
    _keyed(request)
    return get_swagger_ui_html(openapi_url="/openapi.json", title="tokenomy API")


ROUTES = [
    APIRoute("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False),
    APIRoute("/docs", docs, methods=["GET"], include_in_schema=False),
    APIRoute("/v1/chat/completions", chat_completions, methods=["POST"],
             openapi_extra=openapi.documented(ChatCompletionRequest)),
    APIRoute("/v1/completions", completions, methods=["POST"], openapi_extra=openapi.documented(CompletionRequest)),
    APIRoute("/v1/models", models, methods=["GET"]),
    APIRoute("/v1/models/{model_id}", model, methods=["GET"]),
    APIRoute("/health", health, methods=["GET"]),
    APIRoute("/admin/models", admin_models, methods=["GET"]),
    APIRoute("/admin/models/{name}/load", admin_load, methods=["POST"]),
    APIRoute("/admin/models/{name}/unload", admin_unload, methods=["POST"]),
    APIRoute("/metrics", metrics, methods=["GET"]),
]
EXCEPTION_HANDLERS = {APIError: api_error_handler, RequestValidationError: validation_handler,
                      StarletteHTTPException: http_error_handler, Exception: unhandled_handler}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    gateway: Gateway = app.state.gateway
    gateway.start()
    yield
    await gateway.close()


def create_app(gateway: Gateway) -> FastAPI:
    """The OpenAI-compatible app over `gateway`, with the dashboard when it keeps a ledger, the stored Responses
    routes when it stores responses and the Files and Batches routes when batches are enabled. Every endpoint reads
    what it needs from `app.state`."""
    routes = [*ROUTES, *admin.ROUTES, *messages.ROUTES, *embeddings.ROUTES, *responses.ROUTES, *compact.ROUTES,
              *ollama.ROUTES,
              *responses_socket.ROUTES,
              *(responses.ROUTES_STORED if gateway.responses is not None else ()),
              *(conversations.ROUTES if gateway.conversations is not None else ()),
              *(dashboard.ROUTES if gateway.ledger is not None else ()),
              *(batches.ROUTES if gateway.batches is not None else ())]
    app = FastAPI(title="tokenomy", version="0.1.0", routes=routes, exception_handlers=EXCEPTION_HANDLERS,
                  lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    app.state.auth_failures = AuthFailures()
    app.state.responses = responses.ResponsesAPI(
        gateway.responses, lambda request, model, api: parse_recorded(_gateway(request), request, model, api), _owner)
    app.state.conversations = conversations.ConversationsAPI(
        gateway.conversations, lambda request, model, api: parse_recorded(_gateway(request), request, model, api),
        _owner)
    if gateway.ledger is not None:
        fleet = gateway.fleet
        app.state.dashboard = Dashboard(gateway.ledger, gateway.metrics, guard=_admin, feedback_guard=_own_request,
                                        authenticate=_authenticate, models=fleet.ps if fleet is not None else None)
    if gateway.batches is not None:
        app.state.batch_api = BatchAPI(gateway.batches, _owner, max_file_bytes=gateway.config.batch.max_file_bytes,
                                       wake=gateway.batch_runner.wake, max_lines=gateway.config.batch.max_lines,
                                       max_line_bytes=gateway.config.server.max_body_bytes, is_admin=_is_admin)
    openapi.install(app)
    return app


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _authenticate(request: Request) -> None:
    """With keys configured, the request needs a valid key."""
    gateway = _gateway(request)
    if gateway.keyring.enabled:
        gateway.keyring.lookup(request.headers.get("authorization"))


def _keyed(request: Request) -> None:
    """With keys configured, a path not in server.public needs a valid key."""
    if request.url.path not in _gateway(request).config.server.public:
        _authenticate(request)


def _admin(request: Request) -> None:
    _gateway(request).keyring.admin(request.headers.get("authorization"))


def _admin_or_none(request: Request) -> bool:
    """Whether the request presents a valid admin key (no error for none: a public path may be asked without)."""
    try:
        return _is_admin(request)
    except APIError:
        return False


def _is_admin(request: Request) -> bool:
    """Whether the request presents an admin key (False without keys: then every batch is everyone's)."""
    gateway = _gateway(request)
    return gateway.keyring.enabled and gateway.keyring.lookup(request.headers.get("authorization")).admin


def _owner(request: Request) -> tuple[str, str]:
    """Who owns the files and batches a request may see: (key id, tenant); ("", "default") without keys."""
    gateway = _gateway(request)
    if not gateway.keyring.enabled:
        return "", "default"
    info = gateway.keyring.lookup(request.headers.get("authorization"))
    return info.key_id, info.tenant


def _own_request(request: Request, row: Any) -> None:
    """Feedback is for one's own requests (or any, with an admin key); open when no keys are configured. Another
    key's request is refused as the dashboard refuses an unknown id (a 404), so the answer tells nothing of it."""
    gateway = _gateway(request)
    if not gateway.keyring.enabled:
        return
    info = gateway.keyring.lookup(request.headers.get("authorization"))
    if not info.admin and info.key_id != getattr(row, "key_id", None):
        raise dashboard.request_not_found(row.request_id)


async def _serve(request: Request, gateway: Gateway, gen: GenRequest, stream: bool, include_usage: bool,
                 echo: str = "") -> Response:
    try:
        ctx = await serve.run(request, gateway, gen, stream)
    except serve.ClientLeft:
        return serve.client_left()
    except APIError as e:
        return error_response(e)
    if not stream:
        body = chat_body(ctx) if gen.kind == "chat" else completion_body(ctx, echo)
        return JSONResponse(body, headers=serve.tokenomy_headers(ctx, with_cost=True))
    writer = ChunkWriter(ctx, include_usage, echo)
    return serve.stream_response(ctx, writer.chunks, lambda: [writer.done()])

"""POST /v1/embeddings: OpenAI's embeddings endpoint over the gateway (docs/embeddings.md).

The body is parsed as every dialect's is (a ledger row even when refused), run through the gateway's embeddings
pipeline (keys, limits, budgets, the ledger and metrics as for a generation) and rendered off the event loop: the
JSON of 2,048 float vectors takes most of a second to write."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from tokenomy.api import openapi
from tokenomy.api import run as serve
from tokenomy.api.body import parse_recorded
from tokenomy.api.error_bodies import error_response
from tokenomy.dialect.embeddings import EmbeddingRequest, embeddings_body
from tokenomy.errors import APIError
from tokenomy.pipeline.request import RequestContext


async def embeddings(request: Request) -> Response:
    gateway = request.app.state.gateway
    body = await parse_recorded(gateway, request, EmbeddingRequest, "embeddings")
    assert isinstance(body, EmbeddingRequest)
    try:
        ctx = await serve.run(request, gateway, body.gen_request(), stream=False)
    except serve.ClientLeft:
        return serve.client_left()
    except APIError as e:
        return error_response(e)
    content = await asyncio.to_thread(_render, ctx, body.encoding_format)
    return Response(content, media_type="application/json", headers=serve.tokenomy_headers(ctx, with_cost=True))


def _render(ctx: RequestContext, encoding_format: str) -> bytes:
    return json.dumps(embeddings_body(ctx, encoding_format), separators=(",", ":")).encode()


ROUTES = [APIRoute("/v1/embeddings", embeddings, methods=["POST"], openapi_extra=openapi.documented(EmbeddingRequest))]

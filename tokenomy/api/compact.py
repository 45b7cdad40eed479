"""`POST /v1/responses/compact`: a conversation compacted into the item list a later `input` takes in its place
(dialect/responses_compact.py), so the official client's `client.responses.compact` works unchanged.

The summary is one generation through the whole pipeline, by the request's model: keys, limits and budgets are
checked as for any request, and its tokens are billed on its own ledger row (the compacted object's id names it:
resp_<the request id's hex>). An unknown `previous_response_id` is a 404, as for a create.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from tokenomy.api import openapi
from tokenomy.api import run as serve
from tokenomy.api.error_bodies import error_response
from tokenomy.api.responses import API, history_of, responses_api
from tokenomy.dialect.responses_compact import CompactRequest, compacted_output
from tokenomy.dialect.responses_wire import new_id, response_id, usage_body
from tokenomy.errors import APIError


async def compact_response(request: Request) -> Response:
    api, gateway = responses_api(request), request.app.state.gateway
    body = await api.parse(request, CompactRequest, API)
    assert isinstance(body, CompactRequest)
    _, tenant = api.owner_of(request)
    try:
        gen, conversation = body.summary_request(await history_of(api, body, tenant))
    except APIError as e:
        gateway.refused(API, e, serve.headers_of(request))
        raise
    try:
        ctx = await serve.run(request, gateway, gen, False)
    except serve.ClientLeft:
        return serve.client_left()
    except APIError as e:
        return error_response(e)
    assert ctx.result is not None
    summary = " ".join(ctx.result.text.split())
    obj = {"id": response_id(ctx), "object": "response.compaction", "created_at": ctx.created,
           "output": compacted_output(conversation, summary, new_id), "usage": usage_body(ctx.result.usage),
           "image": None, "safety_identifier": body.safety_identifier, "service_tier": "default"}
    return JSONResponse(obj, headers=serve.tokenomy_headers(ctx, with_cost=True))


ROUTES = [APIRoute("/v1/responses/compact", compact_response, methods=["POST"],
                   openapi_extra=openapi.documented(CompactRequest))]

"""Reading a request body without trusting it: a declared Content-Length over the limit is refused before a byte is
read, a chunked body is read only up to the limit, and JSON that parses but cannot be served (a lone surrogate,
nesting too deep) is a 400 naming the field (dialect/json_input.py). Every dialect reads its body here, and the
Files upload its multipart form (read_form)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message

from tokenomy.dialect.json_input import loads
from tokenomy.errors import APIError


def too_large(size: int | str, limit: int) -> APIError:
    return APIError(413, f"Request body is {size} bytes; the limit is {limit}.", code="body_too_large")


def refuse_declared(request: Request, limit: int) -> None:
    """A 413 when the request's Content-Length declares more than `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(declared, limit)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to exceed `limit` bytes."""
    refuse_declared(request, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


@asynccontextmanager
async def read_form(request: Request, limit: int, max_files: int, max_fields: int) -> AsyncIterator[FormData]:
    """The multipart/form-data body as Starlette's FormData, parsed by python-multipart as it streams in (a file
    part spools to disk past 1 MB), under read_body's limit: a declared Content-Length over `limit` is a 413
    before a byte is read, and so is the body once more than `limit` bytes of it have come. A field without a
    filename may be as large as the limit too. A body python-multipart cannot parse, or one with more than
    `max_files` files or `max_fields` fields, is a 400. The form's files are closed on exit."""
    refuse_declared(request, limit)
    size = 0

    async def receive() -> Message:
        nonlocal size
        message = await request.receive()
        size += len(message.get("body", b""))
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        return message

    try:
        form = await Request(request.scope, receive).form(max_files=max_files, max_fields=max_fields,
                                                          max_part_size=limit)
    except (HTTPException, MultiPartException) as e:      # Starlette's 400 for what python-multipart refused
        reason = e.detail if isinstance(e, HTTPException) else e.message
        raise APIError(400, f"The multipart body could not be read: {reason}", code="invalid_request") from None
    try:
        yield form
    finally:
        await form.close()


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object (read_body's limit), or a 400 that says what is wrong with it (json_input.loads:
    the same checks as every batch line and stored field)."""
    data = loads(await read_body(request, limit), "The request body")
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_body")
    return data


async def parse_recorded(gateway: Any, request: Request, model: type[BaseModel], api: str) -> BaseModel:
    """Authenticate, then parse the body of a call to `api` as `model` (no byte of it is read for a caller
    without a valid key); a refused request still gets its ledger row (status 4xx, no model), through
    `gateway.refused`."""
    try:
        if gateway.keyring.enabled:      # kept for the admit stage (api/run.py run), which hashes it once
            request.scope["tokenomy.key"] = gateway.keyring.lookup(request.headers.get("authorization"))
        return await parse(request, model, gateway.config.server.max_body_bytes)
    except (APIError, RequestValidationError) as e:
        err = e if isinstance(e, APIError) else APIError(400, "invalid request body", code="invalid_value")
        gateway.refused(api, err, {k.lower(): v for k, v in request.headers.items()})
        raise


async def parse(request: Request, model: type[BaseModel], limit: int) -> BaseModel:
    """The body as `model`: APIError 400 for bytes that are not a UTF-8 JSON object, RequestValidationError for
    one `model` refuses (the app's handler turns it into the dialect's 400)."""
    data = await read_json(request, limit)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from e

"""OpenAI's Files and Batches routes, so the official client's batch calls work unchanged (docs/batch.md).

    POST /v1/files (multipart: file, purpose=batch)   GET /v1/files[/{id}[/content]]   DELETE /v1/files/{id}
    POST /v1/batches   GET /v1/batches[/{id}]   POST /v1/batches/{id}/cancel

Every file and batch belongs to the key that created it; another key gets a 404, as if it did not exist. The app
holds a BatchAPI as `app.state.batch_api` and includes ROUTES.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.datastructures import UploadFile

from tokenomy.api.body import read_body, read_form
from tokenomy.batch.database import ENDPOINTS, WINDOW_S, BatchStore, file_object
from tokenomy.errors import APIError

T = TypeVar("T")


MAX_FORM_FIELDS = 16   # purpose, and room for the optional ones OpenAI's Files API has (expires_after[...])


@dataclass(frozen=True)
class BatchAPI:
    """What the routes read from `app.state.batch_api`: the store, `owner_of(request)`, which authenticates the
    caller ((key id or "" without keys, tenant)), the largest file an upload may be, and `wake()`, which tells the
    batch runner there is work."""

    store: BatchStore
    owner_of: Callable[[Request], tuple[str, str]]
    max_file_bytes: int
    wake: Callable[[], None]


def _api(request: Request) -> tuple[BatchAPI, str, str]:
    """The app's BatchAPI and the caller's (owner, tenant)."""
    api: BatchAPI = request.app.state.batch_api
    return api, *api.owner_of(request)


def _not_found(what: str, ident: str) -> APIError:
    return APIError(404, f"No such {what}: '{ident}'", code="not_found")


async def _owned(get: Callable[[str, str], T | None], what: str, ident: str, owner: str) -> T:
    """The owner's file or batch (`get` is the store's lookup); anyone else's, or none, is a 404."""
    found = await asyncio.to_thread(get, ident, owner)
    if found is None:
        raise _not_found(what, ident)
    return found


async def create_file(request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise APIError(400, "Upload the file as multipart/form-data with fields 'file' and 'purpose'.",
                       code="invalid_request")
    async with read_form(request, api.max_file_bytes, max_files=1, max_fields=MAX_FORM_FIELDS) as form:
        purpose = form.get("purpose")
        purpose = purpose.strip() if isinstance(purpose, str) else ""
        if purpose != "batch":
            raise APIError(400, f"purpose must be 'batch' (got {purpose!r}).", param="purpose",
                           code="invalid_value")
        upload = form.get("file")
        if upload is None:
            raise APIError(400, "Missing required parameter: 'file'.", param="file", code="invalid_value")
        if isinstance(upload, UploadFile):
            filename, content = upload.filename, await upload.read()
        else:                # a part without a filename is a plain field: its text, as UTF-8
            filename, content = None, upload.encode("utf-8")
    return await asyncio.to_thread(api.store.create_file, owner, purpose, filename or "upload.jsonl", content)


async def list_files(request: Request, purpose: str | None = None) -> dict[str, Any]:
    api, owner, _ = _api(request)
    data = await asyncio.to_thread(api.store.list_files, owner, purpose)
    return {"object": "list", "data": data, "has_more": False}


async def get_file(file_id: str, request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    return file_object(await _owned(api.store.get_file, "file", file_id, owner))


async def file_content(file_id: str, request: Request) -> Response:
    api, owner, _ = _api(request)
    row = await _owned(api.store.get_file, "file", file_id, owner)
    return Response(row["content"], media_type="application/jsonl")


async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    if not await asyncio.to_thread(api.store.delete_file, file_id, owner):
        raise _not_found("file", file_id)
    return {"id": file_id, "object": "file", "deleted": True}


async def create_batch(request: Request) -> dict[str, Any]:
    api, owner, tenant = _api(request)
    try:
        body = json.loads(await read_body(request, 1 << 20))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "The request body must be JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_body")
    endpoint, window = body.get("endpoint"), body.get("completion_window")
    if endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint",
                       code="invalid_value")
    if window not in WINDOW_S:
        raise APIError(400, "completion_window must be '24h'.", param="completion_window", code="invalid_value")
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or len(meta) > 16
                             or not all(isinstance(v, str) for v in meta.values())):
        raise APIError(400, "metadata must be at most 16 string pairs.", param="metadata", code="invalid_value")
    file_id = str(body.get("input_file_id", ""))
    row = await _owned(api.store.get_file, "file", file_id, owner)
    if row["purpose"] != "batch":
        raise APIError(400, "input_file_id must be a file uploaded with purpose 'batch'.",
                       param="input_file_id", code="invalid_value")
    batch = await asyncio.to_thread(api.store.create_batch, owner, tenant, file_id, endpoint, window, meta,
                                    row["content"])
    api.wake()
    return batch


async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
    api, owner, _ = _api(request)
    limit = max(1, min(limit, 100))
    data = await asyncio.to_thread(api.store.list_batches, owner, limit + 1, after)
    more, data = len(data) > limit, data[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    return await _owned(api.store.get_batch, "batch", batch_id, owner)


async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    await _owned(api.store.get_batch, "batch", batch_id, owner)
    await asyncio.to_thread(api.store.set_status, batch_id, "cancelling", ("validating", "in_progress"))
    api.wake()
    batch = await asyncio.to_thread(api.store.get_batch, batch_id, owner)
    assert batch is not None
    return batch


ROUTES = [
    APIRoute("/v1/files", create_file, methods=["POST"]),
    APIRoute("/v1/files", list_files, methods=["GET"]),
    APIRoute("/v1/files/{file_id}", get_file, methods=["GET"]),
    APIRoute("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    APIRoute("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    APIRoute("/v1/batches", create_batch, methods=["POST"]),
    APIRoute("/v1/batches", list_batches, methods=["GET"]),
    APIRoute("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    APIRoute("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]

"""OpenAI's Files and Batches routes, so the official client's batch calls work unchanged (docs/batch.md).

    POST /v1/files (multipart: file, purpose=batch)   GET /v1/files[/{id}[/content]]   DELETE /v1/files/{id}
    POST /v1/batches   GET /v1/batches[/{id}]   POST /v1/batches/{id}/cancel

Every file and batch belongs to the key that created it; another key gets a 404, as if it did not exist.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tokenomy.api.body import read_body
from tokenomy.batch.store import ENDPOINTS, WINDOW_S, BatchStore, file_object
from tokenomy.errors import APIError

T = TypeVar("T")


def parse_form(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data fields: {name: (filename or None, bytes)} (the stdlib's MIME parser)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise APIError(400, "Upload the file as multipart/form-data with fields 'file' and 'purpose'.",
                       code="invalid_request")
    msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


def batch_router(store: BatchStore, owner_of: Callable[[Request], tuple[str, str]], *, max_file_bytes: int,
                 wake: Callable[[], None]) -> APIRouter:
    """`owner_of(request)` authenticates the caller: (key id or "" without keys, tenant)."""
    r = APIRouter()

    def not_found(what: str, ident: str) -> APIError:
        return APIError(404, f"No such {what}: '{ident}'", code="not_found")

    async def owned(get: Callable[[str, str], T | None], what: str, ident: str, owner: str) -> T:
        """The owner's file or batch (`get` is the store's lookup); anyone else's, or none, is a 404."""
        found = await asyncio.to_thread(get, ident, owner)
        if found is None:
            raise not_found(what, ident)
        return found

    @r.post("/v1/files")
    async def create_file(request: Request) -> dict[str, Any]:
        owner, _ = owner_of(request)
        form = parse_form(await read_body(request, max_file_bytes), request.headers.get("content-type", ""))
        purpose = form.get("purpose", (None, b""))[1].decode("utf-8", errors="replace").strip()
        if purpose != "batch":
            raise APIError(400, f"purpose must be 'batch' (got {purpose!r}).", param="purpose",
                           code="invalid_value")
        if "file" not in form:
            raise APIError(400, "Missing required parameter: 'file'.", param="file", code="invalid_value")
        filename, content = form["file"]
        return await asyncio.to_thread(store.create_file, owner, purpose, filename or "upload.jsonl", content)

    @r.get("/v1/files")
    async def list_files(request: Request, purpose: str | None = None) -> dict[str, Any]:
        owner, _ = owner_of(request)
        data = await asyncio.to_thread(store.list_files, owner, purpose)
        return {"object": "list", "data": data, "has_more": False}

    @r.get("/v1/files/{file_id}")
    async def get_file(file_id: str, request: Request) -> dict[str, Any]:
        owner, _ = owner_of(request)
        return file_object(await owned(store.get_file, "file", file_id, owner))

    @r.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str, request: Request) -> Response:
        owner, _ = owner_of(request)
        row = await owned(store.get_file, "file", file_id, owner)
        return Response(row["content"], media_type="application/jsonl")

    @r.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
        owner, _ = owner_of(request)
        if not await asyncio.to_thread(store.delete_file, file_id, owner):
            raise not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @r.post("/v1/batches")
    async def create_batch(request: Request) -> dict[str, Any]:
        owner, tenant = owner_of(request)
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
        row = await owned(store.get_file, "file", file_id, owner)
        if row["purpose"] != "batch":
            raise APIError(400, "input_file_id must be a file uploaded with purpose 'batch'.",
                           param="input_file_id", code="invalid_value")
        batch = await asyncio.to_thread(store.create_batch, owner, tenant, file_id, endpoint, window, meta,
                                        row["content"])
        wake()
        return batch

    @r.get("/v1/batches")
    async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        owner, _ = owner_of(request)
        limit = max(1, min(limit, 100))
        data = await asyncio.to_thread(store.list_batches, owner, limit + 1, after)
        more, data = len(data) > limit, data[:limit]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    @r.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
        owner, _ = owner_of(request)
        return await owned(store.get_batch, "batch", batch_id, owner)

    @r.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
        owner, _ = owner_of(request)
        await owned(store.get_batch, "batch", batch_id, owner)
        await asyncio.to_thread(store.set_status, batch_id, "cancelling", ("validating", "in_progress"))
        wake()
        batch = await asyncio.to_thread(store.get_batch, batch_id, owner)
        assert batch is not None
        return batch

    return r

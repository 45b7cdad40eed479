"""OpenAI's Files and Batches routes, so the official client's batch calls work unchanged (docs/batch.md).

    POST /v1/files (multipart: file, purpose=batch)   GET /v1/files[/{id}[/content]]   DELETE /v1/files/{id}
    POST /v1/batches   GET /v1/batches[/{id}]   POST /v1/batches/{id}/cancel

Every file and batch belongs to the key that created it; another key gets a 404, as if it did not exist, except an
admin key, which lists, reads and cancels every batch. A batch's body goes through the checks every body gets
(body.read_json), its input file through batch/input_lines.py's, line by line; a request refused stores nothing.
The app holds a BatchAPI as `app.state.batch_api` and includes ROUTES.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.datastructures import UploadFile

from tokenomy.api.body import read_form, read_json
from tokenomy.batch.database import ENDPOINTS, WINDOW_S, BatchStore, file_object
from tokenomy.batch.input_lines import count_lines
from tokenomy.errors import APIError

T = TypeVar("T")


MAX_FORM_FIELDS = 16   # purpose, and room for the optional ones OpenAI's Files API has (expires_after[...])
MAX_BATCH_BODY = 1 << 20
MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512      # OpenAI's limits on metadata


@dataclass(frozen=True)
class BatchAPI:
    """What the routes read from `app.state.batch_api`: the store, `owner_of(request)`, which authenticates the
    caller ((key id or "" without keys, tenant)), the largest file an upload may be, `wake()`, which tells the
    batch runner there is work, the most lines a batch may have and bytes a line, and `is_admin(request)`."""

    store: BatchStore
    owner_of: Callable[[Request], tuple[str, str]]
    max_file_bytes: int
    wake: Callable[[], None]
    max_lines: int = 50_000
    max_line_bytes: int = 4 << 20
    is_admin: Callable[[Request], bool] = lambda request: False


def _api(request: Request) -> tuple[BatchAPI, str, str]:
    """The app's BatchAPI and the caller's (owner, tenant)."""
    api: BatchAPI = request.app.state.batch_api
    return api, *api.owner_of(request)


def _batch_owner(api: BatchAPI, request: Request, owner: str) -> str | None:
    """Whose batches the caller sees: its own, or (None) every key's with an admin key."""
    return None if api.is_admin(request) else owner


def _not_found(what: str, ident: str) -> APIError:
    return APIError(404, f"No such {what}: '{ident}'", code="not_found")


async def _owned(get: Callable[[str, Any], T | None], what: str, ident: str, owner: str | None) -> T:
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


def _metadata(meta: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most MAX_METADATA string pairs, keys to MAX_METADATA_KEY characters, values to
    MAX_METADATA_VALUE (read_json has already refused lone surrogates)."""
    if meta is None:
        return None
    if not isinstance(meta, dict) or len(meta) > MAX_METADATA or not all(
            isinstance(v, str) and len(k) <= MAX_METADATA_KEY and len(v) <= MAX_METADATA_VALUE
            for k, v in meta.items()):
        raise APIError(400, f"metadata must be at most {MAX_METADATA} string pairs, keys at most "
                       f"{MAX_METADATA_KEY} characters and values at most {MAX_METADATA_VALUE}.",
                       param="metadata", code="invalid_value")
    return meta


async def create_batch(request: Request) -> dict[str, Any]:
    api, owner, tenant = _api(request)
    body = await read_json(request, MAX_BATCH_BODY)
    endpoint, window = body.get("endpoint"), body.get("completion_window")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint",
                       code="invalid_value")
    if not isinstance(window, str) or window not in WINDOW_S:     # a dict is no key of WINDOW_S, nor hashable
        raise APIError(400, "completion_window must be '24h'.", param="completion_window", code="invalid_value")
    meta = _metadata(body.get("metadata"))
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise APIError(400, "input_file_id must be a file id.", param="input_file_id", code="invalid_value")
    row = await _owned(api.store.get_file, "file", file_id, owner)
    if row["purpose"] != "batch":
        raise APIError(400, "input_file_id must be a file uploaded with purpose 'batch'.",
                       param="input_file_id", code="invalid_value")
    lines = await asyncio.to_thread(count_lines, row["content"])
    if lines > api.max_lines:
        raise APIError(400, f"The input file has {lines} requests; a batch may have at most {api.max_lines} "
                       "(batch.max_lines).", param="input_file_id", code="too_many_lines")
    batch = await asyncio.to_thread(api.store.create_batch, owner, tenant, file_id, endpoint, window, meta,
                                    row["content"], api.max_line_bytes)
    api.wake()
    return batch


async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
    """The caller's batches, newest first (an admin key: every key's)."""
    api, owner, _ = _api(request)
    limit = max(1, min(limit, 100))
    data = await asyncio.to_thread(api.store.list_batches, _batch_owner(api, request, owner), limit + 1, after)
    more, data = len(data) > limit, data[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
    api, owner, _ = _api(request)
    return await _owned(api.store.get_batch, "batch", batch_id, _batch_owner(api, request, owner))


async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    """Cancel the caller's batch (an admin key: anyone's); the runner ends it, failing what has not run."""
    api, owner, _ = _api(request)
    whose = _batch_owner(api, request, owner)
    await _owned(api.store.get_batch, "batch", batch_id, whose)
    await asyncio.to_thread(api.store.set_status, batch_id, "cancelling", ("validating", "in_progress"))
    api.wake()
    batch = await asyncio.to_thread(api.store.get_batch, batch_id, whose)
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

"""Reading a request body without trusting its size: a declared Content-Length over the limit is refused before a
byte is read, and a chunked body is read only up to the limit."""

from __future__ import annotations

from starlette.requests import Request

from tokenomy.errors import APIError


def too_large(size: int | str, limit: int) -> APIError:
    return APIError(413, f"Request body is {size} bytes; the limit is {limit}.", code="body_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(declared, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)

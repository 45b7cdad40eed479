"""A batch input file, line by line, through the checks every HTTP body gets (dialect/json_input.py, then the
endpoint's own body model, dialect/chat.py's gen_request), so that a line the API would refuse with a 400 fails as
that line, at once, and never reaches the worker.

The file is read as a stream of lines (no list of lines, no list of parsed objects): a batch's memory at creation
is its file's bytes plus one chunk of items (database.py inserts CHUNK at a time), whatever its line count. Limits
(docs/batch.md): at most `max_lines` requests per file, counted before anything is stored; a line longer than
`max_line_bytes` (the server's request body limit) fails as that line."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from tokenomy.dialect.chat import gen_request
from tokenomy.dialect.json_input import is_text, loads
from tokenomy.errors import APIError

Parsed = tuple[str | None, dict[str, Any] | None, dict[str, Any] | None]


def error_line(custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """A line of the error file for a request that never got a response (OpenAI's batch error shape)."""
    return {"id": "batch_req_" + uuid.uuid4().hex[:24], "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def count_lines(content: bytes) -> int:
    """The non-empty lines of `content` (a blank line is no request), without splitting it."""
    n = 0
    for raw in io.BytesIO(content):
        if raw.strip():
            n += 1
    return n


def parse_input(content: bytes, endpoint: str, max_line_bytes: int = 4 << 20,
                request_id: Callable[[int], str] | None = None) -> Iterator[Parsed]:
    """Each non-empty line of an input file, in order: (custom_id, body, None) for a line that can run, or
    (custom_id or None, None, result line) for one that cannot. A line that is no request (longer than
    `max_line_bytes`, not UTF-8 JSON or too deep to parse, no custom_id or one that is not text, a repeated
    custom_id, another method or url, no body) gets an error line, `{"response": null, "error": {"code",
    "message"}}`; a body the endpoint refuses (dialect/chat.py gen_request: the 400 the HTTP route would answer,
    lone surrogates and nesting included) gets the answer the worker gives a refused request, `{"response":
    {"status_code": 400, "request_id", "body": <OpenAI error body>}, "error": null}`, with `request_id(i)` for the
    i-th request of the file (the worker's first request id for it)."""
    seen: set[str] = set()
    i = -1
    for n, raw in enumerate(io.BytesIO(content), start=1):
        if not raw.strip():
            continue
        i += 1
        size = len(raw.rstrip(b"\r\n"))
        if size > max_line_bytes:
            yield None, None, error_line(None, "line_too_large", f"line {n}: {size} bytes; a line may be at most "
                                         f"{max_line_bytes} bytes")
            continue
        try:
            obj = loads(raw, "The line", check=False)       # the body is checked below, as a body
        except APIError as e:
            yield None, None, error_line(None, e.code or "invalid_json", f"line {n}: {e.message}")
            continue
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        problem = None
        if not isinstance(obj, dict):
            problem = "the line must be a JSON object"
        elif not isinstance(cid, str) or not cid or not is_text(cid):
            problem, cid = "custom_id must be a non-empty string of Unicode text", None
        elif cid in seen:
            problem = f"custom_id {cid!r} is used by an earlier line"
        elif obj.get("method", "POST") != "POST":
            problem = "method must be POST"
        elif obj.get("url") != endpoint:
            problem = f"url must be the batch's endpoint {endpoint}"
        elif not isinstance(obj.get("body"), dict):
            problem = "body must be a JSON object"
        if problem is not None:
            yield cid, None, error_line(cid, "invalid_request", f"line {n}: {problem}")
            continue
        seen.add(cid)
        try:
            gen_request(endpoint, obj["body"])
        except APIError as e:
            yield cid, None, {"id": "batch_req_" + uuid.uuid4().hex[:24], "custom_id": cid, "error": None,
                              "response": {"status_code": e.status, "request_id": request_id(i) if request_id else None,
                                           "body": e.body()}}
            continue
        yield cid, obj["body"], None

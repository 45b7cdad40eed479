"""A minimal Anthropic Messages server for tests: records every request and answers as told, streamed (the
events Anthropic sends, in its order) or as one JSON message. A raw ASGI app, like tests/helpers/upstream_stub.py.

    stub = MessagesStub(key="sk-test")
    stub.replies.append(tool_use("weather", {"city": "Paris"}))      # the next answer; default: DEFAULT_TEXT
    stub.failures.append(Failure(529, "overloaded_error", retry_after="0"))   # answered before any reply
    stub.failing = Failure(401, "authentication_error")               # answered to every request while set
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.upstream_stub import read_body

DEFAULT_TEXT = "Hello from the Messages stub."


@dataclass
class Failure:
    status: int
    kind: str                               # the Anthropic error type: invalid_request_error, overloaded_error ...
    retry_after: str | None = None
    message: str = "stub failure"


@dataclass
class Reply:
    """One answer: content blocks, why it stopped, and its usage (cache reads and writes as Anthropic reports)."""

    content: list[dict[str, Any]]
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    input_tokens: int = 12
    cache_read: int = 0
    cache_write: int = 0
    output_tokens: int = 6
    error_after_start: dict[str, Any] | None = None     # an `error` event right after message_start
    cut_after_text: bool = False                        # the connection breaks after the first text delta
    usage: bool = True                                  # False: no usage at all, as some servers answer


def text(t: str = DEFAULT_TEXT, **kw: Any) -> Reply:
    return Reply([{"type": "text", "text": t}], **kw)


def tool_use(name: str, args: dict[str, Any], tool_id: str = "toolu_01", **kw: Any) -> Reply:
    return Reply([{"type": "tool_use", "id": tool_id, "name": name, "input": args}], stop_reason="tool_use", **kw)


@dataclass
class MessagesStub:
    key: str | None = None                   # when set, requests without this key (x-api-key or bearer) get a 401
    json_answers: bool = False               # answer streamed requests with one JSON message
    replies: list[Reply] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    failing: Failure | None = None           # while set, the answer to every request (after `failures`)
    requests: list[dict[str, Any]] = field(default_factory=list)    # {"path", "headers", "body"} of each request

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"] == "/v1/models":
            await _json(send, 200, {"data": [{"type": "model", "id": "stub"}], "has_more": False})
            return
        body = json.loads(await read_body(receive) or b"{}")
        self.requests.append({"path": scope["path"], "headers": headers, "body": body})
        if scope["path"] != "/v1/messages":
            await _error(send, Failure(404, "not_found_error", message=f"no route {scope['path']}"))
        elif self.key is not None and self.key not in (headers.get("x-api-key"),
                                                       headers.get("authorization", "").removeprefix("Bearer ")):
            await _error(send, Failure(401, "authentication_error", message="invalid API key"))
        elif self.failures:
            await _error(send, self.failures.pop(0))
        elif self.failing is not None:
            await _error(send, self.failing)
        else:
            reply = self.replies.pop(0) if self.replies else text()
            message = _message(body, reply)
            if body.get("stream") and not self.json_answers:
                await _stream(send, message, reply)
            else:
                await _json(send, 200, message)


def _message(body: dict[str, Any], r: Reply) -> dict[str, Any]:
    usage = {"input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
             "cache_read_input_tokens": r.cache_read, "cache_creation_input_tokens": r.cache_write}
    return {"id": "msg_stub", "type": "message", "role": "assistant", "model": body.get("model", "stub"),
            "content": r.content, "stop_reason": r.stop_reason, "stop_sequence": r.stop_sequence,
            **({"usage": usage} if r.usage else {})}


def _pieces(s: str, n: int = 3) -> list[str]:
    """`s` in about n pieces, as a stream delivers it."""
    size = max(1, -(-len(s) // n))
    return [s[i:i + size] for i in range(0, len(s), size)]


async def _stream(send: Any, message: dict[str, Any], r: Reply) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    if r.usage:
        start["usage"] = {**message["usage"], "output_tokens": 1}
    await _event(send, "message_start", {"type": "message_start", "message": start})
    if r.error_after_start is not None:
        await _event(send, "error", {"type": "error", "error": r.error_after_start})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await _event(send, "ping", {"type": "ping"})
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            await _event(send, "content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}})
            for piece in _pieces(block["text"]):
                await _event(send, "content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "text_delta", "text": piece}})
                if r.cut_after_text:
                    raise ConnectionAbortedError("the stub breaks the connection mid-answer")
        else:
            await _event(send, "content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {**block, "input": {}}})
            for piece in _pieces(json.dumps(block["input"])):
                await _event(send, "content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": piece}})
        await _event(send, "content_block_stop", {"type": "content_block_stop", "index": i})
    await _event(send, "message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": r.stop_reason, "stop_sequence": r.stop_sequence},
                                         **({"usage": {"output_tokens": r.output_tokens}} if r.usage else {})})
    await _event(send, "message_stop", {"type": "message_stop"})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _event(send: Any, name: str, data: dict[str, Any]) -> None:
    raw = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    await send({"type": "http.response.body", "body": raw, "more_body": True})


async def _error(send: Any, f: Failure) -> None:
    headers = {"retry-after": f.retry_after} if f.retry_after is not None else {}
    await _json(send, f.status, {"type": "error", "error": {"type": f.kind, "message": f.message}}, headers)


async def _json(send: Any, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    raw = json.dumps(obj).encode()
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": raw})

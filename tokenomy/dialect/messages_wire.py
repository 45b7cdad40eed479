"""Anthropic Messages response bodies, SSE events and error bodies, built from the pipeline's result.

Usage: Anthropic's `input_tokens` excludes cache reads, so input_tokens = prompt_tokens - cached_tokens and
cache_read_input_tokens = cached_tokens (the engine's prefix-cache hits, an upstream's cached tokens); nothing is
billed as a cache write (cache_creation_input_tokens 0: the engine keeps every prefix at no extra price).
A tool call's `input` is its arguments parsed as a JSON object (the embedded engine decodes them under the
tool's grammar, so they always parse); its id is the call's own with the `toolu_` prefix.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from tokenomy.errors import APIError
from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.request import RequestContext

log = logging.getLogger("tokenomy.messages")

# HTTP status -> Anthropic's error type (the statuses are tokenomy's own, as for every dialect)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               422: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}


def error_type(status: int, code: str | None = None) -> str:
    if code == "queue_full":        # the engine's queue, not the caller's limits
        return "overloaded_error"
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(err.status, err.code), "message": err.message}}


def message_id(ctx: RequestContext) -> str:
    return "msg_" + ctx.request_id.removeprefix("req_")


def tool_use_id(call_id: str | None) -> str:
    if not call_id:
        return "toolu_" + uuid.uuid4().hex[:24]
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def usage_body(u: Usage | None, prompt_tokens: int | None = None) -> dict[str, Any]:
    """Anthropic's usage; before the answer (message_start) only the counted prompt is known."""
    if u is None:
        return {"input_tokens": prompt_tokens or 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0}
    cached = min(u.cached_tokens, u.prompt_tokens)
    return {"input_tokens": u.prompt_tokens - cached, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def stop_reason(finish: str | None, stop_sequence: str | None, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for the pipeline's finish_reason."""
    if called and finish in ("stop", "tool_calls"):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "stop" and stop_sequence is not None:
        return "stop_sequence", stop_sequence
    return "end_turn", None


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object `input` must be; an upstream's unparsable arguments become {} (logged:
    the generate stage's schema check flags such an answer in x-tokenomy-schema)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        log.warning("tool call arguments are not a JSON object: %.200r", arguments)
        return {}
    return value


def message_body(ctx: RequestContext) -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    content: list[dict[str, Any]] = []
    if r.text:
        content.append({"type": "text", "text": r.text})
    for call in r.tool_calls or []:
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": tool_use_id(call.get("id")), "name": fn.get("name", ""),
                        "input": tool_input(fn.get("arguments") or "")})
    reason, sequence = stop_reason(r.finish_reason, r.stop_sequence, bool(r.tool_calls))
    return {"id": message_id(ctx), "type": "message", "role": "assistant", "model": ctx.model or ctx.gen.model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence, "usage": usage_body(r.usage)}


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


PING = event("ping", {"type": "ping"})


def error_event(err: APIError) -> bytes:
    return event("error", error_body(err))


class EventWriter:
    """Turns deltas into Messages stream events: message_start (before the first delta, unless `start` sent it
    already), then content blocks that open and close in order (a text block, then one tool_use block per call,
    its input streamed as input_json_delta fragments), then message_delta; `end` adds message_stop."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.started = False
        self.index = -1                 # the content block now open (-1: none yet)
        self.open = False
        self.kind: str | None = None    # text | tool_use
        self.calls: dict[int, int] = {}  # an OpenAI tool-call index -> its content block

    def start(self) -> bytes:
        self.started = True
        ctx = self.ctx
        message = {"id": message_id(ctx), "type": "message", "role": "assistant",
                   "model": ctx.model or ctx.serving or ctx.gen.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": usage_body(None, ctx.prompt_tokens)}
        return event("message_start", {"type": "message_start", "message": message})

    def chunks(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = [] if self.started else [self.start()]
        if delta.error:
            return [*out, error_event(APIError(502, delta.error))]
        if delta.text:
            if self.kind != "text" or not self.open:
                out += self._begin("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta.text}))
        for call in delta.tool_calls or []:
            fn = call.get("function") or {}
            i = call.get("index", 0)
            if i not in self.calls:
                out += self._begin("tool_use", {"type": "tool_use", "id": tool_use_id(call.get("id")),
                                                "name": fn.get("name", ""), "input": {}})
                self.calls[i] = self.index
            if fn.get("arguments"):
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": self.calls[i],
                                                         "delta": {"type": "input_json_delta",
                                                                   "partial_json": fn["arguments"]}}))
        if delta.finish_reason is not None:
            out += self._close()
            reason, sequence = stop_reason(delta.finish_reason, delta.stop_sequence, bool(self.calls))
            out.append(event("message_delta", {"type": "message_delta",
                                               "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                               "usage": usage_body(delta.usage)}))
        return out

    @staticmethod
    def end() -> list[bytes]:
        return [event("message_stop", {"type": "message_stop"})]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open, self.kind = True, kind
        out.append(event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                 "content_block": block}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> list[bytes]:
        if not self.open:
            return []
        self.open = False
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

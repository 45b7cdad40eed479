"""OpenAI Responses API answers: the response object and its semantic stream events, built from the pipeline's
result (`response_body`) or its deltas (`ResponseEvents`).

A stream is: response.created, response.in_progress, then per output item response.output_item.added, for a
message response.content_part.added, response.output_text.delta ... response.output_text.done and
response.content_part.done, for a function call response.function_call_arguments.delta ... .done, for a custom
tool's call response.custom_tool_call_input.delta ... .done, then
response.output_item.done; and last response.completed, response.incomplete (the answer hit max_output_tokens) or
response.failed (an error after the stream began). Every event has `type` and a `sequence_number` counting from 0,
and rides an SSE `event:` line of the same name.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from tokenomy.dialect.responses import ResponsesRequest
from tokenomy.dialect.responses_custom import custom_call_item
from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.request import RequestContext


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def response_id(ctx: RequestContext) -> str:
    """The response's id, which names its request (and ledger row) too: resp_<the request id's hex>."""
    return "resp_" + ctx.request_id.removeprefix("req_")


def usage_body(u: Usage | None) -> dict[str, Any]:
    u = u or Usage()
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0,
                                     "cache_write_tokens_details": None},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) for an answer that ended with `finish_reason`."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "phase": None,
            "content": [text_part(text)] if status != "in_progress" else []}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn.get("name", ""),
            "arguments": fn.get("arguments", ""), "status": status, "namespace": None, "caller": None,
            "async": None}


def function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the response echoes it: every field OpenAI's reference gives one, `strict` true
    unless the request said false (a grammar writes every call, so its arguments always match the schema)."""
    return {"type": "function", "name": tool.get("name"), "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict") is not False,
            "allowed_callers": None, "async": None, "defer_loading": None, "output_schema": None}


def output_items(text: str, tool_calls: list[dict[str, Any]] | None, status: str) -> list[dict[str, Any]]:
    """A whole answer's output: a message when there is text (or nothing else), then one item per call."""
    items = [message_item(new_id("msg_"), text, status)] if text or not tool_calls else []
    return items + [custom_call_item(new_id("ctc_"), c) if c.get("type") == "custom"
                    else call_item(new_id("fc_"), c, "completed") for c in tool_calls or []]


def response_body(ctx: RequestContext, body: ResponsesRequest, stored: bool, status: str,
                  output: list[dict[str, Any]], usage: Usage | None = None,
                  incomplete: dict[str, str] | None = None, error: dict[str, str] | None = None) -> dict[str, Any]:
    """The response object with every field of OpenAI's reference and the Open Responses specification; the
    request's settings echoed as OpenAI echoes them (function and custom tools only: the others were not offered to the
    model), null for what tokenomy has no value of (a hosted feature it does not run)."""
    text = {"format": (body.text or {}).get("format") or {"type": "text"},
            "verbosity": (body.text or {}).get("verbosity") or "medium"}
    return {
        "id": response_id(ctx), "object": "response", "created_at": ctx.created,
        "completed_at": int(time.time()) if status == "completed" else None, "status": status,
        "background": False, "error": error, "incomplete_details": incomplete,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "max_tool_calls": None,
        "model": ctx.model or body.model, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "conversation": conversation_ref(body),
        "reasoning": {"effort": None, "summary": None, "context": None, "generate_summary": None, "mode": None},
        "service_tier": "default", "store": stored,
        "temperature": 1.0 if body.temperature is None else body.temperature, "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": [function_tool(t) if t.get("type") == "function" else t
                  for t in body.tools or [] if t.get("type") in ("function", "custom")],
        "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled",
        "presence_penalty": body.presence_penalty or 0.0, "frequency_penalty": body.frequency_penalty or 0.0,
        "top_logprobs": body.top_logprobs or 0,
        "usage": usage_body(usage) if status != "in_progress" else None, "user": body.user,
        "metadata": body.metadata or {}, "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key, "prompt_cache_retention": body.prompt_cache_retention,
        "prompt": None, "prompt_cache_options": None, "prompt_cache_diagnostics": None, "access_programs": None,
        "image": None, "input_transformations": None, "moderation": None, "tool_usage": None,
    }


def conversation_ref(body: ResponsesRequest) -> dict[str, str] | None:
    """`conversation` as the response names it: {"id"} of the conversation the request named, else null."""
    conv = body.conversation
    if conv is None:
        return None
    return {"id": conv if isinstance(conv, str) else str(conv.get("id"))}


def final_body(ctx: RequestContext, body: ResponsesRequest, stored: bool) -> dict[str, Any]:
    """The object for a finished, non-streamed answer (ctx.result)."""
    r = ctx.result
    assert r is not None
    status, incomplete = status_of(r.finish_reason)
    return response_body(ctx, body, stored, status, output_items(r.text, r.tool_calls, status), r.usage, incomplete)


def failure(delta: Delta) -> dict[str, Any]:
    """A failed response's `error`: code server_error (the reference's codes name OpenAI's own failures), the
    cause's own code as its `type`."""
    return {"code": "server_error", "message": delta.error, "param": None,
            "type": delta.error_code or "server_error", "misalignment": None}


class ResponseEvents:
    """Turns deltas into the semantic events. `chunks(delta)` for each delta (the first one opens the stream with
    response.created and response.in_progress), `end()` after the last; `text` and `tool_calls` are the answer
    so far, `body()` the response object at the end."""

    def __init__(self, ctx: RequestContext, body: ResponsesRequest, stored: bool) -> None:
        self.ctx, self.req, self.stored = ctx, body, stored
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.texts: dict[int, str] = {}         # output index of a message -> its text so far
        self.open: int | None = None            # output index of the item being written
        self.calls: dict[int, tuple[int, dict[str, Any]]] = {}   # delta tool call index -> (output index, call)
        self.finish: str | None = None
        self.usage: Usage | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts.values())

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [call for _, call in self.calls.values()]

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = json.dumps({"type": kind, "sequence_number": self.seq, **fields}, separators=(",", ":"),
                          ensure_ascii=False)
        self.seq += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def body(self, status: str | None = None, error: dict[str, str] | None = None) -> dict[str, Any]:
        """The response object: at the end (status None: from the finish reason), or `status` with the items so
        far (an item cut short by an error is incomplete)."""
        done, incomplete = status_of(self.finish)
        output = [message_item(item["id"], self.texts.get(i, ""), "incomplete")
                  if i == self.open and item["type"] == "message" else dict(item, status="incomplete")
                  if i == self.open else item for i, item in enumerate(self.items)]
        return response_body(self.ctx, self.req, self.stored, status or done, output, self.usage,
                             incomplete if status is None else None, error)

    def chunks(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        if self.seq == 0:
            start = self.body("in_progress")
            out += [self._event("response.created", response=start),
                    self._event("response.in_progress", response=start)]
        if delta.error:
            self.finish = "error"
            out.append(self._event("response.failed", response=self.body("failed", failure(delta))))
            return out
        if delta.text:
            out += self._text(delta.text)
        for tc in delta.tool_calls or []:
            out += self._call(tc)
        if delta.finish_reason is not None:
            self.finish, self.usage = delta.finish_reason, delta.usage
            if not self.items:              # an empty answer is an empty message, as in the whole body
                out += self._open_message()
            out += self._close()
        return out

    def end(self) -> list[bytes]:
        status, _ = status_of(self.finish)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [self._event(kind, response=self.body())]

    # ---- items -------------------------------------------------------------------------------------------
    def _open_message(self) -> list[bytes]:
        out = self._close()
        item = message_item(new_id("msg_"), "", "in_progress")
        self.items.append(item)
        self.open = len(self.items) - 1
        self.texts[self.open] = ""
        return out + [self._event("response.output_item.added", output_index=self.open, item=item),
                      self._event("response.content_part.added", item_id=item["id"], output_index=self.open,
                                  content_index=0, part=text_part(""))]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self.open is not None and self.items[self.open]["type"] == "message" else self._open_message()
        at = self.open
        assert at is not None
        self.texts[at] += text
        return out + [self._event("response.output_text.delta", item_id=self.items[at]["id"], output_index=at,
                                  content_index=0, delta=text, logprobs=[])]

    def _call(self, tc: dict[str, Any]) -> list[bytes]:
        if tc.get("type") == "custom" or "custom" in tc:
            return self._custom_call(tc)
        out: list[bytes] = []
        fn = tc.get("function") or {}
        index = tc.get("index", len(self.calls))
        if index not in self.calls:             # a new call: its first delta has the id and the name
            out += self._close()
            call = {"id": tc.get("id") or new_id("call_"), "type": "function",
                    "function": {"name": fn.get("name", ""), "arguments": ""}}
            item = call_item(new_id("fc_"), call, "in_progress")
            self.items.append(item)
            self.open = len(self.items) - 1
            self.calls[index] = (self.open, call)
            out.append(self._event("response.output_item.added", output_index=self.open, item=dict(item)))
        at, call = self.calls[index]
        fragment = fn.get("arguments") or ""
        if fragment:
            self.items[at]["arguments"] += fragment
            call["function"]["arguments"] += fragment
            out.append(self._event("response.function_call_arguments.delta", item_id=self.items[at]["id"],
                                   output_index=at, delta=fragment))
        return out

    def _custom_call(self, tc: dict[str, Any]) -> list[bytes]:
        """A custom tool's call: its item, then response.custom_tool_call_input.delta per input fragment."""
        out: list[bytes] = []
        index = tc.get("index", len(self.calls))
        if index not in self.calls:
            out += self._close()
            call = {"id": tc.get("id") or new_id("call_"), "type": "custom",
                    "custom": {"name": (tc.get("custom") or {}).get("name", ""), "input": ""}}
            item = custom_call_item(new_id("ctc_"), call)
            self.items.append(item)
            self.open = len(self.items) - 1
            self.calls[index] = (self.open, call)
            out.append(self._event("response.output_item.added", output_index=self.open, item=dict(item)))
        at, call = self.calls[index]
        fragment = (tc.get("custom") or {}).get("input") or ""
        if fragment:
            self.items[at]["input"] += fragment
            call["custom"]["input"] += fragment
            out.append(self._event("response.custom_tool_call_input.delta", item_id=self.items[at]["id"],
                                   output_index=at, delta=fragment))
        return out

    def _close(self) -> list[bytes]:
        """Finish the item being written: its done events, with the item as it ends."""
        if self.open is None:
            return []
        at, self.open = self.open, None
        item = self.items[at]
        if item["type"] == "message":
            text = self.texts[at]
            status = "incomplete" if status_of(self.finish)[0] == "incomplete" else "completed"
            self.items[at] = item = message_item(item["id"], text, status)
            return [self._event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                                text=text, logprobs=[]),
                    self._event("response.content_part.done", item_id=item["id"], output_index=at,
                                content_index=0, part=text_part(text)),
                    self._event("response.output_item.done", output_index=at, item=item)]
        if item["type"] == "custom_tool_call":
            return [self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=at,
                                input=item["input"]),
                    self._event("response.output_item.done", output_index=at, item=dict(item))]
        item["status"] = "completed"
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=at, item=dict(item))]

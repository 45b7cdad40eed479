"""Ollama's response bodies and NDJSON stream lines, built from the pipeline's result (docs/ollama.md).

Durations are nanoseconds, measured: `total_duration` from the request's arrival at the gateway to the answer,
`prompt_eval_duration` from the engine's scheduling of the request to its first token (the backend's ttft_s less
queue_s), `eval_duration` from the first token to the last (e2e_s less ttft_s), `load_duration` 0 (the model was
loaded before the request came: loading on demand is the many-models work). `prompt_eval_count` is the prompt's
tokens (the prefix cache's hits included: Ollama counts every prompt token too), `eval_count` the answer's.
`done_reason` is `stop` (an end token, a stop string or a tool call) or `length`.
A tool call is Ollama's shape: `{"id", "function": {"index", "name", "arguments": {...}}}`, the arguments parsed
from the JSON the engine decoded under the tool's grammar; a stream sends each call whole, in the line that ends
the answer's text.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.request import RequestContext

NS = 1_000_000_000


def timestamp() -> str:
    """Now, as Ollama writes `created_at` (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def error_line(message: str) -> bytes:
    return line({"error": message})


def done_reason(finish: str | None) -> str:
    return "length" if finish == "length" else "stop"


def durations(ctx: RequestContext, usage: Usage | None) -> dict[str, int]:
    """The final object's counts and durations (ns), from the request's clock and the backend's usage."""
    total = time.perf_counter() - ctx.started
    u = usage or Usage()
    ttft = u.ttft_s if u.ttft_s is not None else u.e2e_s
    prompt_s = max(ttft - u.queue_s, 0.0)
    eval_s = max(u.e2e_s - ttft, 0.0)
    return {"total_duration": int(total * NS), "load_duration": int(u.load_s * NS),
            "prompt_eval_count": u.prompt_tokens, "prompt_eval_duration": int(prompt_s * NS),
            "eval_count": u.completion_tokens, "eval_duration": int(eval_s * NS)}


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls as Ollama's: the arguments an object ({} when they do not parse as one)."""
    out = []
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {}
        out.append({"id": call.get("id") or f"call_{i}", "function": {
            "index": i, "name": fn.get("name", ""), "arguments": args if isinstance(args, dict) else {}}})
    return out


def chat_body(ctx: RequestContext, model: str) -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    message: dict[str, Any] = {"role": "assistant", "content": r.text}
    if r.tool_calls:
        message["tool_calls"] = tool_calls(r.tool_calls)
    return {"model": model, "created_at": timestamp(), "message": message, "done": True,
            "done_reason": done_reason(r.finish_reason), **durations(ctx, r.usage)}


def generate_body(ctx: RequestContext, model: str) -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    return {"model": model, "created_at": timestamp(), "response": r.text, "done": True,
            "done_reason": done_reason(r.finish_reason), **durations(ctx, r.usage)}


def loaded_body(model: str, chat: bool, reason: str = "load") -> dict[str, Any]:
    """The answer to a request with nothing to generate (no prompt, no messages): Ollama's way to load a model
    (`reason` "load") or, with keep_alive 0, to unload it ("unload")."""
    body: dict[str, Any] = {"model": model, "created_at": timestamp(), "done": True, "done_reason": reason}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return body


class LineWriter:
    """Turns deltas into NDJSON lines: one per piece of text (`message.content` for chat, `response` for
    generate), tool calls gathered and sent whole with the last line, which says done with the counts and
    durations; an error is one `{"error": ...}` line."""

    def __init__(self, ctx: RequestContext, model: str, chat: bool) -> None:
        self.ctx, self.model, self.chat = ctx, model, chat
        self.calls: dict[int, dict[str, Any]] = {}      # OpenAI tool-call index -> the call so far

    def _piece(self, text: str, done: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = done
        return body

    def chunks(self, delta: Delta) -> list[bytes]:
        if delta.error:
            return [error_line(delta.error)]
        for call in delta.tool_calls or []:
            i = call.get("index", 0)
            fn = call.get("function") or {}
            held = self.calls.setdefault(i, {"id": call.get("id"), "function": {"name": "", "arguments": ""}})
            held["id"] = held["id"] or call.get("id")
            held["function"]["name"] += fn.get("name") or ""
            held["function"]["arguments"] += fn.get("arguments") or ""
        out = [line(self._piece(delta.text, False))] if delta.text else []
        if delta.last:
            body = self._piece("", True)
            if self.calls and self.chat:
                body["message"]["tool_calls"] = tool_calls([self.calls[i] for i in sorted(self.calls)])
            body["done_reason"] = done_reason(delta.finish_reason)
            body.update(durations(self.ctx, delta.usage))
            out.append(line(body))
        return out

    @staticmethod
    def end() -> list[bytes]:
        return []

"""What tokenomy's spans say, in the OpenTelemetry GenAI semantic conventions' names (gen_ai.*, v1.40) and
tokenomy's own (tokenomy.*): a request's and an upstream call's request parameters, usage, answer and error, what
each pipeline stage decided, and the opt-in content (gen_ai.input.messages / gen_ai.output.messages). Read by
telemetry/trace.py; it reads the request context by its fields and imports nothing above the meter.
"""

from __future__ import annotations

import json
from typing import Any

from tokenomy.generation import GenRequest, Usage

OPERATIONS = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}
# the id the client sees in the answer, per API (dialect/*wire.py make them from the request id the same way)
RESPONSE_PREFIX = {"chat.completions": "chatcmpl-", "completions": "cmpl-", "messages": "msg_", "responses": "resp_"}


# the request parameters that are numbers, and their attribute names
_NUMBERS = tuple((key, "gen_ai.request." + key) for key in ("max_tokens", "temperature", "top_p", "seed", "top_k",
                                                             "frequency_penalty", "presence_penalty"))


def request_attributes(gen: GenRequest, provider: str, model: str | None = None, operation: str | None = None,
                       stream: bool | None = None) -> dict[str, Any]:
    """gen_ai.operation.name, gen_ai.provider.name and the gen_ai.request.* attributes of a request."""
    p = gen.params
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation or OPERATIONS.get(gen.kind, gen.kind),
                             "gen_ai.provider.name": provider, "gen_ai.request.model": model or gen.model}
    for key, name in _NUMBERS:
        v = p.get(key)
        if v is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
            attrs[name] = v
    n = p.get("n")
    if isinstance(n, int) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    stop = p.get("stop")
    if stop:
        attrs["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if gen.kind != "embedding":
        attrs["gen_ai.request.stream"] = gen.stream if stream is None else stream
    return attrs


def usage_attributes(u: Usage) -> dict[str, Any]:
    attrs = {"gen_ai.usage.input_tokens": u.prompt_tokens, "gen_ai.usage.output_tokens": u.completion_tokens,
             "gen_ai.usage.cache_read.input_tokens": u.cached_tokens}
    if u.cache_write_tokens:
        attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write_tokens
    return attrs


def answer_attributes(ctx: Any) -> dict[str, Any]:
    """The request span's gen_ai.response.* and gen_ai.usage.* attributes and tokenomy's own."""
    attrs: dict[str, Any] = {"tokenomy.request_id": ctx.request_id, "tokenomy.tenant": ctx.tenant,
                             "tokenomy.api": ctx.gen.api, "tokenomy.cache": ctx.cache,
                             "http.response.status_code": ctx.status if ctx.error is None else ctx.error.status}
    prefix = RESPONSE_PREFIX.get(ctx.gen.api)
    if prefix is not None:
        attrs["gen_ai.response.id"] = prefix + ctx.request_id.removeprefix("req_")
    if ctx.route is not None:
        attrs["tokenomy.route"] = ctx.route
    if ctx.key_id is not None:
        attrs["tokenomy.key_id"] = ctx.key_id
    if ctx.model:
        attrs["gen_ai.response.model"] = ctx.model
    result = ctx.result
    reasons = [c.finish_reason for c in result.all_choices] if result is not None else (
        [ctx.finish_reason] if ctx.finish_reason else [])
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    if ctx.usage is not None:
        attrs.update(usage_attributes(ctx.usage))
    if ctx.cost_usd:
        attrs["tokenomy.cost_usd"] = ctx.cost_usd
    return attrs


def stage_attributes(name: str, ctx: Any) -> dict[str, Any]:
    """What a stage decided, as its span says it."""
    if name == "admit":
        return {"tokenomy.tenant": ctx.tenant, **({"tokenomy.key_id": ctx.key_id} if ctx.key_id else {})}
    if name == "context":
        attrs: dict[str, Any] = {"tokenomy.context.over_budget": bool(ctx.over_budget)}
        if ctx.prompt_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = ctx.prompt_tokens
        work = ctx.context_work
        if work is not None:
            attrs.update({"tokenomy.context.tokens_before": work.before, "tokenomy.context.tokens_after": work.after,
                          "tokenomy.context.actions": list(work.actions)})
        return attrs
    if name == "cache":
        outcome = "bypass" if ctx.cache == "miss" and ctx.cache_bypass else ctx.cache
        attrs = {"tokenomy.cache.outcome": outcome}
        if ctx.cache_bypass and outcome == "bypass":
            attrs["tokenomy.cache.bypass"] = ctx.cache_bypass
        saving = ctx.cache_saving
        if saving is not None:
            attrs["tokenomy.cache.saved_tokens"] = saving.tokens
            if saving.similarity is not None:
                attrs["tokenomy.cache.similarity"] = saving.similarity
        return attrs
    if name == "route":
        d = ctx.route_decision
        if d is None:
            return {}
        attrs = {"tokenomy.route.chosen": d.chosen, "tokenomy.route.by": d.by,
                 "tokenomy.route.candidates": list(d.candidates)}
        if d.route is not None:
            attrs["tokenomy.route"] = d.route
        return attrs
    if name in ("generate", "embed"):
        attrs = {"tokenomy.attempts": [f"{a['model']}: {a['outcome']}" for a in ctx.attempts]}
        if ctx.model:
            attrs["gen_ai.response.model"] = ctx.model
        return attrs
    return {}


def content_attributes(ctx: Any) -> dict[str, str]:
    """gen_ai.input.messages and gen_ai.output.messages (JSON, the conventions' message shape) of a request."""
    gen = ctx.gen
    if gen.kind == "embedding":
        return {}
    if gen.messages is not None:
        inputs = [{"role": m.get("role", "user"), "parts": _parts(m)} for m in gen.messages]
    else:
        inputs = [{"role": "user", "parts": [{"type": "text", "content": gen.prompt or ""}]}]
    attrs = {"gen_ai.input.messages": json.dumps(inputs, ensure_ascii=False)}
    choices = ctx.result.all_choices if ctx.result is not None else None
    if choices is not None:
        outputs = [_output(c.text, c.tool_calls, c.finish_reason) for c in choices]
    elif ctx.usage is not None or ctx.text:
        outputs = [_output(ctx.text, None, ctx.finish_reason)]
    else:
        return attrs
    attrs["gen_ai.output.messages"] = json.dumps(outputs, ensure_ascii=False)
    return attrs


def _parts(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append({"type": "text", "content": p["text"]})
            elif isinstance(p, dict):
                parts.append({"type": str(p.get("type", "unknown"))})
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                      "arguments": fn.get("arguments")})
    if m.get("role") == "tool" and parts and parts[0]["type"] == "text":
        parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": parts[0]["content"]}]
    return parts


def _output(text: str, tool_calls: list[dict[str, Any]] | None, finish: str | None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    for call in tool_calls or []:
        fn = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                      "arguments": fn.get("arguments")})
    return {"role": "assistant", "parts": parts, "finish_reason": finish or ""}


def error_type(ctx: Any) -> str | None:
    """error.type of a request that failed: its error's code (else its HTTP status), `stream_error` for a stream
    that failed after its 200, `cancelled` when the client left; None when it succeeded."""
    if ctx.error is not None:
        return ctx.error.code or str(ctx.error.status)
    if ctx.stream_error:
        return "stream_error"
    if ctx.finish_reason == "error":
        return "error"
    if ctx.finish_reason == "cancelled":
        return "cancelled"
    return None

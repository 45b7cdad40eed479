"""OpenAI response bodies and SSE chunks, built from the pipeline's result."""

from __future__ import annotations

import json
from typing import Any

from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.request import RequestContext, Result


def usage_body(u: Usage | None) -> dict[str, Any]:
    """OpenAI's usage object; an answer several models wrote (token-level routing) adds `models`, each model's
    own tokens (the top-level counts are their sums), and `handovers`."""
    u = u or Usage()
    body: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0,
                                      "accepted_prediction_tokens": u.accepted_prediction_tokens or 0,
                                      "rejected_prediction_tokens": u.rejected_prediction_tokens or 0},
    }
    if u.parts:
        body["models"] = {name: {"prompt_tokens": p.prompt_tokens, "completion_tokens": p.completion_tokens,
                                 "prompt_tokens_details": {"cached_tokens": p.cached_tokens}}
                          for name, p in u.parts}
        body["handovers"] = u.handovers or 0
    return body


def response_id(ctx: RequestContext) -> str:
    prefix = "chatcmpl-" if ctx.gen.kind == "chat" else "cmpl-"
    return prefix + ctx.request_id.removeprefix("req_")


def chat_logprobs(lps: list[dict[str, Any]]) -> dict[str, Any] | None:
    return {"content": lps, "refusal": None} if lps else None


def completion_logprobs(lps: list[dict[str, Any]], offset: int = 0) -> dict[str, Any] | None:
    if not lps:
        return None
    tokens, token_lps, tops, offsets = [], [], [], []
    pos = offset
    for e in lps:
        tokens.append(e["token"])
        token_lps.append(e["logprob"])
        tops.append({t["token"]: t["logprob"] for t in e.get("top_logprobs", [])})
        offsets.append(pos)
        pos += len(e["token"])
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_body(ctx: RequestContext) -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    return {
        "id": response_id(ctx), "object": "chat.completion", "created": ctx.created, "model": ctx.model,
        "choices": [chat_choice(i, c) for i, c in enumerate(r.all_choices)],
        "usage": usage_body(r.usage), "system_fingerprint": None,
    }


def chat_choice(index: int, c: Result) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None}
    finish = c.finish_reason
    if c.tool_calls:
        message["content"] = None
        message["tool_calls"] = c.tool_calls
        finish = "tool_calls" if finish == "stop" else finish
    return {"index": index, "message": message, "logprobs": chat_logprobs(c.logprobs), "finish_reason": finish}


def completion_body(ctx: RequestContext, echo_prefix: str = "") -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    return {
        "id": response_id(ctx), "object": "text_completion", "created": ctx.created, "model": ctx.model,
        "choices": [{"index": i, "text": echo_prefix + c.text, "logprobs": completion_logprobs(c.logprobs),
                     "finish_reason": c.finish_reason} for i, c in enumerate(r.all_choices)],
        "usage": usage_body(r.usage), "system_fingerprint": None,
    }


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class ChunkWriter:
    """Turns deltas into OpenAI stream chunks (chat or completion), with include_usage semantics; each chunk carries
    one choice, by its index (n > 1: the choices' chunks interleave, each choice opening and finishing its own)."""

    def __init__(self, ctx: RequestContext, include_usage: bool, echo_prefix: str = "") -> None:
        self.ctx = ctx
        self.include_usage = include_usage
        self.echo = echo_prefix
        self.started: set[int] = set()       # the choices whose first chunk went out

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.ctx.gen.kind == "chat" else "text_completion"
        d: dict[str, Any] = {"id": response_id(self.ctx), "object": obj, "created": self.ctx.created,
                             "model": self.ctx.model, "system_fingerprint": None}
        if self.include_usage:
            d["usage"] = None
        return d

    def chunks(self, delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        if delta.error:
            out.append(sse({"error": {"message": delta.error, "type": "server_error", "param": None,
                                      "code": delta.error_code or "upstream_error"}}))
            return out
        chat = self.ctx.gen.kind == "chat"
        i = delta.index
        first = i not in self.started
        self.started.add(i)
        if chat:
            if first:
                out.append(sse(self._choice(i, {"role": "assistant", "content": ""}, None, None)))
            if delta.text or delta.logprobs:
                out.append(sse(self._choice(i, {"content": delta.text}, chat_logprobs(delta.logprobs), None)))
            if delta.tool_calls:
                out.append(sse(self._choice(i, {"tool_calls": delta.tool_calls}, None, None)))
        else:
            text = self.echo + delta.text if first else delta.text
            if text or delta.logprobs:
                out.append(sse(self._choice(i, text, completion_logprobs(delta.logprobs), None)))
        if delta.finish_reason is not None:
            out.append(sse(self._choice(i, {} if chat else "", None, delta.finish_reason)))
        if self.include_usage and delta.usage is not None:     # the last delta: every choice has finished
            last = self._base()
            last["choices"] = []
            last["usage"] = usage_body(delta.usage)
            out.append(sse(last))
        return out

    def _choice(self, index: int, delta: dict[str, Any] | str, logprobs: dict[str, Any] | None,
                finish: str | None) -> dict[str, Any]:
        d = self._base()
        if isinstance(delta, str):
            d["choices"] = [{"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}]
        else:
            d["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        return d

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"

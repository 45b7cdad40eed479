"""OpenAI response bodies and SSE chunks, built from the pipeline's result."""

from __future__ import annotations

import json
from typing import Any

from tokenomy.generation import Delta, Usage
from tokenomy.pipeline.request import RequestContext


def usage_body(u: Usage | None) -> dict[str, Any]:
    """OpenAI's usage object; an answer several models wrote (token-level routing) adds `models`, each model's
    own tokens (the top-level counts are their sums), and `handovers`."""
    u = u or Usage()
    body: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
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
    message: dict[str, Any] = {"role": "assistant", "content": r.text, "refusal": None}
    finish = r.finish_reason
    if r.tool_calls:
        message["content"] = None
        message["tool_calls"] = r.tool_calls
        finish = "tool_calls" if finish == "stop" else finish
    logprobs = chat_logprobs(r.logprobs)
    return {
        "id": response_id(ctx), "object": "chat.completion", "created": ctx.created, "model": ctx.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage_body(r.usage), "system_fingerprint": None,
    }


def completion_body(ctx: RequestContext, echo_prefix: str = "") -> dict[str, Any]:
    r = ctx.result
    assert r is not None
    return {
        "id": response_id(ctx), "object": "text_completion", "created": ctx.created, "model": ctx.model,
        "choices": [{"index": 0, "text": echo_prefix + r.text, "logprobs": completion_logprobs(r.logprobs),
                     "finish_reason": r.finish_reason}],
        "usage": usage_body(r.usage), "system_fingerprint": None,
    }


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class ChunkWriter:
    """Turns deltas into OpenAI stream chunks (chat or completion), with include_usage semantics."""

    def __init__(self, ctx: RequestContext, include_usage: bool, echo_prefix: str = "") -> None:
        self.ctx = ctx
        self.include_usage = include_usage
        self.echo = echo_prefix
        self.started = False
        self.tool_index = 0

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
                                      "code": "upstream_error"}}))
            return out
        chat = self.ctx.gen.kind == "chat"
        if chat and not self.started:
            self.started = True
            out.append(sse(self._choice({"role": "assistant", "content": ""}, None, None)))
        if chat:
            if delta.text or delta.logprobs:
                out.append(sse(self._choice({"content": delta.text}, chat_logprobs(delta.logprobs), None)))
            if delta.tool_calls:
                out.append(sse(self._choice({"tool_calls": delta.tool_calls}, None, None)))
        else:
            text = delta.text
            if not self.started:
                self.started, text = True, self.echo + text
            if text or delta.logprobs:
                out.append(sse(self._choice(text, completion_logprobs(delta.logprobs), None)))
        if delta.finish_reason is not None:
            out.append(sse(self._choice({} if chat else "", None, delta.finish_reason)))
            if self.include_usage:
                last = self._base()
                last["choices"] = []
                last["usage"] = usage_body(delta.usage)
                out.append(sse(last))
        return out

    def _choice(self, delta: dict[str, Any] | str, logprobs: dict[str, Any] | None, finish: str | None
                ) -> dict[str, Any]:
        d = self._base()
        if isinstance(delta, str):
            d["choices"] = [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}]
        else:
            d["choices"] = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        return d

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"

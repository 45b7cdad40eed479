"""Stored prompts: a request's body and its answer, kept beside its ledger row for `tokenomy replay`.

Only for tenants that opted in (`ledger.store_prompts`, `ledger.store_prompts_tenants`); the record stage writes
one in the same transaction as its row, and the ledger deletes those older than `ledger.retention_days`. What is
kept is what replay needs to ask the caches and the router again: the request as the pipeline saw it (kind,
model asked, messages or prompt, the output-changing parameters, tools, response format, the cache-control and
x-tokenomy-meta-* headers) and the answer's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from tokenomy.generation import GenRequest

KEPT_HEADERS = ("cache-control",)
META_PREFIX = "x-tokenomy-meta-"


class FinishedRequest(Protocol):
    """What is stored of a finished request: the pipeline's RequestContext, by its typed fields."""

    request_id: str
    tenant: str
    gen: GenRequest
    headers: dict[str, str]
    text: str


@dataclass
class StoredPrompt:
    request_id: str
    ts: float
    tenant: str
    request: dict[str, Any]
    answer: str | None = None

    def to_db(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "ts": self.ts, "tenant": self.tenant,
                "request": json.dumps(self.request, separators=(",", ":"), default=str), "answer": self.answer}

    @classmethod
    def from_db(cls, data: Any) -> StoredPrompt:
        return cls(request_id=data["request_id"], ts=float(data["ts"]), tenant=data["tenant"],
                   request=json.loads(data["request"]), answer=data["answer"])

    def gen_request(self) -> GenRequest:
        r = self.request
        return GenRequest(model=r.get("model", ""), kind=r.get("kind", "chat"), messages=r.get("messages"),
                          prompt=r.get("prompt"), params=dict(r.get("params") or {}), tools=r.get("tools"),
                          tool_choice=r.get("tool_choice"), response_format=r.get("response_format"),
                          request_id=self.request_id)

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.request.get("headers") or {})


def prompt_from_context(ctx: FinishedRequest, ts: float) -> StoredPrompt:
    g = ctx.gen
    headers = {k: v for k, v in ctx.headers.items() if k in KEPT_HEADERS or k.startswith(META_PREFIX)}
    request = {"kind": g.kind, "model": g.model, "messages": g.messages, "prompt": g.prompt, "params": g.params,
               "tools": g.tools, "tool_choice": g.tool_choice, "response_format": g.response_format,
               "headers": headers}
    return StoredPrompt(request_id=ctx.request_id, ts=ts, tenant=ctx.tenant, request=request,
                        answer=ctx.text or None)

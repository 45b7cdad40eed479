"""The request context: the one object every stage reads and writes."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tokenomy.backends.base import Delta, GenRequest, Usage
from tokenomy.errors import APIError


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex[:24]


@dataclass
class Result:
    """A finished, non-streamed answer."""

    text: str
    finish_reason: str
    usage: Usage
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None
    confidence: list[float] = field(default_factory=list)   # chosen-token logprobs, when known


@dataclass
class RequestContext:
    gen: GenRequest
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)   # lower-cased request headers
    request_id: str = field(default_factory=new_request_id)
    started: float = field(default_factory=time.perf_counter)
    created: int = field(default_factory=lambda: int(time.time()))
    # admit
    key_id: str | None = None
    tenant: str = "default"
    # context
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool = True
    over_budget: bool = False
    # cache
    cache: str = "miss"                       # miss | exact | semantic | bypass
    # Default-MiniLM vectors of texts this request needed ({text: vector}), filled by whichever stage embeds a
    # text first (cache lookup, router), so the lookup, the router and the cache add embed each text once.
    vectors: dict[str, Any] = field(default_factory=dict)
    # route
    route: str | None = None                  # the route name asked for, if any
    candidates: list[str] = field(default_factory=list)
    model: str | None = None                  # the model that served
    route_reason: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    # generate
    result: Result | None = None
    deltas: AsyncIterator[Delta] | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    text: str = ""
    # record
    error: APIError | None = None
    status: int = 200
    response_headers: dict[str, str] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def asked_model(self) -> str:
        return self.gen.model

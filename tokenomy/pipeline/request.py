"""The request context: the one object every stage reads and writes."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenomy.errors import APIError
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.ledger.row import CacheSaving

if TYPE_CHECKING:      # types only: each lies in a layer below the pipeline's
    import numpy as np

    from tokenomy.context.lint import Finding
    from tokenomy.limits.keys import KeyInfo
    from tokenomy.router.token_routing import TokenRouter
    from tokenomy.telemetry.trace import RequestTrace


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex[:24]


@dataclass
class Result:
    """A finished, non-streamed answer: its first choice, and with several choices (n > 1) every one of them in
    `choices`, by index (the first equal to this one; `usage` is always the whole answer's)."""

    text: str
    finish_reason: str
    usage: Usage
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None
    confidence: list[float] = field(default_factory=list)   # chosen-token logprobs, when known
    stop_sequence: str | None = None          # the stop string that ended the answer, when the backend says
    choices: list[Result] = field(default_factory=list)

    @property
    def all_choices(self) -> list[Result]:
        """Every choice, by index: `choices`, or this one alone."""
        return self.choices or [self]


@dataclass
class RouteDecision:
    """How a route chose its model: what the meter prices a route's saving against, and what logs explain."""

    candidates: list[str]                     # the route's models, cheapest first
    chosen: str
    by: str                                   # pinned | rules | classifier ... (the strategy that decided)
    route: str | None = None
    strategies: list[str] = field(default_factory=list)
    signals: dict[str, Any] = field(default_factory=dict)
    escalations: list[dict[str, Any]] = field(default_factory=list)
    served: str | None = None


@dataclass
class ContextWork:
    """What the context stage did to a prompt (docs/context.md): the ledger row and x-tokenomy-context say it."""

    before: int                               # prompt tokens as the client sent them
    after: int                                # prompt tokens sent to the model
    actions: list[str] = field(default_factory=list)
    cost_usd: float = 0.0                     # summaries and the compressor, priced
    seconds: float = 0.0                      # time the stage spent on it (summaries, compression)
    summary_calls: int = 0
    compress_seconds: float = 0.0
    compress_removed: int = 0
    compress_decision: str | None = None

    def header(self) -> str:
        done = "; ".join(self.actions) if self.actions else "none"
        return f"{done}; tokens={self.before}->{self.after}"


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
    key: KeyInfo | None = None     # the request's key: set by the API layer that checked it first, else by admit
    allowed_models: frozenset[str] | None = None   # the key's allow-list (None: every model)
    # context
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool = True
    over_budget: bool = False
    context_work: ContextWork | None = None   # set when the route's context levers ran
    lint: Finding | None = None               # the prompt-layout lint's finding (tokenomy/context/lint.py)
    # cache
    cache: str = "miss"                       # miss | explore | exact | semantic | bypass
    cache_bypass: str | None = None           # why the request was not eligible for the response cache
    cache_saving: CacheSaving | None = None
    # Default-MiniLM vectors of texts this request needed ({text: vector}), filled by whichever stage embeds a
    # text first (cache lookup, router), so the lookup, the router and the cache add embed each text once.
    vectors: dict[str, Any] = field(default_factory=dict)
    # route
    route: str | None = None                  # the route name asked for, if any
    candidates: list[str] = field(default_factory=list)
    model: str | None = None                  # the model that served
    route_reason: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    route_decision: RouteDecision | None = None
    escalations: list[tuple[str, Usage]] = field(default_factory=list)   # discarded (paid) answers: model, usage
    token_router: TokenRouter | None = None   # a token route's router (router/token_routing.py), which serves
    #                                           its small model's candidate in the generate stage
    # reserve (pipeline/reserve.py): the model the request's hold is priced at and its USD; `cover(ctx, model)`
    # holds more before a dearer model serves it (a fallback), raising the budget's 429 when that does not fit
    reserved: tuple[str, float] | None = None
    cover: Callable[[RequestContext, str], None] | None = None
    # generate
    result: Result | None = None
    deltas: AsyncIterator[Delta] | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    text: str = ""
    serving: str | None = None                # the model at work, should the client leave before it answers
    seen_tokens: int = 0                      # completion tokens streamed so far
    schema_problem: str | None = None         # the answer did not validate against the request's schema
    embeddings: np.ndarray | None = None      # an embeddings request's vectors: float32 (inputs, dimensions)
    stream_error: str | None = None           # a stream that failed after its 200
    # record
    error: APIError | None = None
    status: int = 200
    response_headers: dict[str, str] = field(default_factory=dict)
    cost_usd: float = 0.0                     # set by the meter: what this request cost, discarded answers too
    # batch (tokenomy/batch/): the batch this request belongs to; its row is marked and priced at the batch price
    batch_id: str | None = None
    # traces (telemetry/trace.py): the request's RequestTrace while traced; the trace id its ledger row carries (a
    # caller's traceparent's even with tracing off)
    trace: RequestTrace | None = None
    trace_id: str | None = None

    @property
    def asked_model(self) -> str:
        return self.gen.model

    @property
    def api(self) -> str:
        return self.gen.api

    @property
    def user(self) -> str | None:
        """The end user the client named (OpenAI's `user`, Anthropic's `metadata.user_id`)."""
        return self.gen.user

    @property
    def route_candidates(self) -> list[str]:
        return self.route_decision.candidates if self.route_decision is not None else []

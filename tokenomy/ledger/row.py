"""One ledger row per request, built from the finished RequestContext.

Conventions every report figure relies on (so each one can be recomputed from rows):
- `ts` is the request's arrival time (UNIX seconds, UTC); `e2e_s` runs from arrival to the record stage (for a
  stream, after its last event); `queue_s`, `ttft_s` come from the backend's usage; `tpot_s` =
  (usage.e2e_s - ttft_s) / (completion_tokens - 1), as the Prometheus histogram computes it.
- Tokens are the usage the client received. A response-cache hit (`cache` exact or semantic) costs nothing, so
  its cost columns are zero and its usage, priced, is its saving; its queue/TTFT/TPOT are NULL (no generation).
- `billed_tokens` = prompt + completion of rows a model generated (not response-cache hits), errors included.
- `delivered_tokens` = completion tokens of rows that succeeded (`ok`), cache hits included.
- `cache` is miss | exact | semantic | bypass (the request was not eligible for the response cache).
- `saved_by` maps each layer that saved something (exact, semantic, prefix, route) to
  {"tokens", "usd"}; `saved_tokens` and `saved_usd` are its sums.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenomy.errors import APIError
from tokenomy.generation import Usage
from tokenomy.hardware.energy import Energy, label
from tokenomy.ledger.pricing import PriceLike, cache_saving, cache_write_rate, cost, prefix_saving

log = logging.getLogger("tokenomy.ledger")

CACHE_HITS = frozenset({"exact", "semantic"})
FAILED_FINISH = frozenset({"error", "cancelled"})
SAVING_LAYERS = ("exact", "semantic", "prefix", "route", "compress")


@dataclass(frozen=True)
class Saving:
    """What one layer saved on one request."""

    tokens: int
    usd: float


@dataclass
class CacheSaving:
    """A response-cache hit: what the stored answer cost when it was generated, now saved."""

    by: str                                   # exact | semantic
    tokens: int
    usd: float
    similarity: float | None = None
    entry_id: str | None = None


class Finished(Protocol):
    """What the meter reads of a finished request: the pipeline's RequestContext, by its typed fields."""

    request_id: str
    started: float
    tenant: str
    key_id: str | None
    route: str | None
    model: str | None
    cache: str
    cache_bypass: str | None
    cache_saving: CacheSaving | None
    usage: Usage | None
    finish_reason: str | None
    over_budget: bool
    error: APIError | None
    status: int
    stream_error: str | None
    schema_problem: str | None
    escalations: list[tuple[str, Usage]]
    cost_usd: float                           # the meter writes it; the response header reads it
    batch_id: str | None                      # set for a batch request (its row is marked and batch-priced)

    @property
    def api(self) -> str: ...

    @property
    def asked_model(self) -> str: ...

    @property
    def route_candidates(self) -> list[str]: ...


@dataclass
class LedgerRow:
    request_id: str
    ts: float
    tenant: str = "default"
    key_id: str | None = None
    route: str | None = None
    model: str | None = None
    backend: str | None = None
    cache: str = "miss"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    status: int = 200
    error_code: str | None = None
    error: str | None = None
    finish_reason: str | None = None
    price_input: float = 0.0            # USD per 1M tokens, as priced at the time
    price_cached_input: float = 0.0
    price_output: float = 0.0
    price_notional: bool = False
    cost_input_usd: float = 0.0
    cost_cached_input_usd: float = 0.0
    cost_output_usd: float = 0.0
    cost_usd: float = 0.0
    energy_j: float | None = None
    energy_source: str | None = None    # nvml | rapl | estimate; None when not measured (e.g. an upstream)
    saved_tokens: int = 0
    saved_usd: float = 0.0
    saved_by: dict[str, dict[str, float]] = field(default_factory=dict)
    over_budget: bool = False           # the prompt exceeded its route's context budget
    feedback_score: float | None = None
    feedback_comment: str | None = None
    feedback_ts: float | None = None
    batch: str | None = None            # the batch id of a batch request, priced at the batch price
    # the context stage (NULL when it did nothing): tokens before/after its work, what it did and cost; the lint
    context_tokens_before: int | None = None
    context_tokens_after: int | None = None
    context_actions: str | None = None
    context_cost_usd: float | None = None
    context_s: float | None = None
    lint_units: int | None = None
    lint_prefix: int | None = None
    lint_potential: int | None = None
    lint_breaks: list[dict[str, Any]] | None = None
    replica: str | None = None          # the replica of a pooled model that served (host:port); None: not pooled
    draft_tokens: int | None = None     # speculative draft tokens fed (embedded engine; NULL: not reported)
    draft_accepted: int | None = None   # ... and accepted
    handovers: int | None = None        # token-level routing: times the large model took over (NULL: not routed)
    parts: list[dict[str, Any]] | None = None   # an answer several models wrote: each one's usage and cost
    api: str | None = None              # the API called: chat.completions | completions | messages | responses
    #                                     | embeddings (NULL on rows from before it was recorded)
    # prompt tokens the upstream wrote to its prompt cache (part of prompt_tokens, apart from cached_tokens), the
    # rate they were priced at (NULL on rows from before it was recorded: the input price) and their cost
    cache_write_tokens: int = 0
    price_cache_write: float | None = None
    cost_cache_write_usd: float = 0.0
    trace_id: str | None = None         # the request's trace (32 hex digits; NULL: not traced, no traceparent)
    user: str | None = None             # the end user the client named (OpenAI `user`, Anthropic metadata.user_id)

    @property
    def cache_hit(self) -> bool:
        return self.cache in CACHE_HITS

    @property
    def ok(self) -> bool:
        return self.status < 400 and self.finish_reason not in FAILED_FINISH

    @property
    def billed_tokens(self) -> int:
        return 0 if self.cache_hit else self.prompt_tokens + self.completion_tokens

    @property
    def delivered_tokens(self) -> int:
        return self.completion_tokens if self.ok else 0

    @property
    def energy_label(self) -> str | None:
        return label(self.energy_source)

    def to_dict(self) -> dict[str, Any]:
        # Shallow by hand: dataclasses.asdict deep-copies every field and was most of the writer's time.
        d = {name: getattr(self, name) for name in _FIELDS}
        d["saved_by"] = {k: dict(v) for k, v in self.saved_by.items()}
        return d

    def to_db(self) -> dict[str, Any]:
        d = self.to_dict()
        d["saved_by"] = json.dumps(self.saved_by, sort_keys=True, separators=(",", ":"))
        if self.lint_breaks is not None:
            d["lint_breaks"] = json.dumps(self.lint_breaks, separators=(",", ":"))
        if self.parts is not None:
            d["parts"] = json.dumps(self.parts, separators=(",", ":"))
        return d

    @classmethod
    def from_db(cls, data: Any) -> LedgerRow:
        d = {name: data[name] for name in _FIELDS if name in data}
        raw = d.get("saved_by")
        d["saved_by"] = json.loads(raw) if isinstance(raw, str) and raw else {}
        d["price_notional"] = bool(d.get("price_notional"))
        d["over_budget"] = bool(d.get("over_budget"))
        raw = d.get("lint_breaks")
        d["lint_breaks"] = json.loads(raw) if isinstance(raw, str) and raw else None
        raw = d.get("parts")
        d["parts"] = json.loads(raw) if isinstance(raw, str) and raw else None
        d["cache_write_tokens"] = d.get("cache_write_tokens") or 0        # NULL on rows from before step 10
        d["cost_cache_write_usd"] = d.get("cost_cache_write_usd") or 0.0
        return cls(**d)


_FIELDS = tuple(f.name for f in dataclasses.fields(LedgerRow))


def _saving(value: Any) -> tuple[int, float]:
    if isinstance(value, Saving):
        return value.tokens, value.usd
    if isinstance(value, dict):
        return int(value.get("tokens", 0)), float(value.get("usd", 0.0))
    tokens, usd = value         # a (tokens, usd) pair
    return int(tokens), float(usd)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _stage_savings(ctx: Finished, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Savings found: the cache stage's hit, and `extra` from the caller (the meter sink's route saving), each
    {layer: Saving | {"tokens", "usd"} | (tokens, usd)}."""
    found: dict[str, Any] = {}
    if ctx.cache_saving is not None:
        found[ctx.cache_saving.by] = Saving(ctx.cache_saving.tokens, ctx.cache_saving.usd)
    found.update(extra or {})
    return found


def _user(ctx: Finished) -> str | None:
    user = getattr(ctx, "user", None)
    return user[:256] if isinstance(user, str) and user else None


def row_from_context(ctx: Finished, price: PriceLike | None, energy: Energy | None = None,
                     backend: str | None = None, now: float | None = None,
                     savings: Mapping[str, Any] | None = None) -> LedgerRow:
    """The ledger row of a finished request. `price` the served model's
    (None: unknown, priced at zero); `energy` its attributed joules (None for upstream or unmeasured);
    `savings` more {layer: saving} found by the caller (e.g. the route's)."""
    elapsed = time.perf_counter() - ctx.started
    now = time.time() if now is None else now
    u: Usage = ctx.usage or Usage()
    hit = ctx.cache in CACHE_HITS
    prompt, completion = max(int(u.prompt_tokens), 0), max(int(u.completion_tokens), 0)
    cached = min(max(int(u.cached_tokens), 0), prompt)
    if cached != u.cached_tokens:
        log.warning("request %s: cached_tokens %s outside [0, prompt_tokens=%s]; priced as %s",
                    ctx.request_id, u.cached_tokens, prompt, cached)
    written = min(max(int(u.cache_write_tokens), 0), prompt - cached)
    if written != u.cache_write_tokens:
        log.warning("request %s: cache_write_tokens %s outside [0, prompt_tokens - cached_tokens=%s]; priced as %s",
                    ctx.request_id, u.cache_write_tokens, prompt - cached, written)
    saved: dict[str, dict[str, float]] = {}
    for layer, value in _stage_savings(ctx, savings).items():
        try:
            tokens, usd = _saving(value)
        except (TypeError, ValueError):
            log.warning("request %s: ignoring malformed saving %r for %s", ctx.request_id, value, layer)
            continue
        saved[str(layer)] = {"tokens": tokens, "usd": usd}
    row = LedgerRow(
        request_id=ctx.request_id, ts=now - elapsed, tenant=ctx.tenant, key_id=ctx.key_id, route=ctx.route,
        model=ctx.model, backend=backend, prompt_tokens=prompt, cached_tokens=cached, cache_write_tokens=written,
        cache="bypass" if ctx.cache == "miss" and ctx.cache_bypass else ctx.cache,
        completion_tokens=completion, e2e_s=elapsed, finish_reason=ctx.finish_reason,
        over_budget=bool(ctx.over_budget), batch=ctx.batch_id, replica=u.replica,
        draft_tokens=u.draft_tokens, draft_accepted=u.draft_accepted, handovers=u.handovers, api=ctx.api,
        trace_id=getattr(ctx, "trace_id", None), user=_user(ctx),
    )
    if ctx.error is not None:
        row.status, row.error_code, row.error = ctx.error.status, ctx.error.code, ctx.error.message[:500]
    else:
        row.status = ctx.status         # a stream that failed after its 200 keeps it, and says why below
        if ctx.stream_error:
            row.error_code, row.error = "stream_error", ctx.stream_error[:500]
    if price is not None:
        row.price_input, row.price_cached_input = price.input, price.cached_input
        row.price_output, row.price_notional = price.output, bool(price.notional)
        row.price_cache_write = cache_write_rate(price)
    if hit:
        if ctx.cache not in saved and price is not None:
            saved[ctx.cache] = {"tokens": prompt + completion,
                                "usd": cache_saving(price, prompt, cached, completion, written)}
    else:
        row.queue_s, row.ttft_s = _finite(u.queue_s) if ctx.usage else None, _finite(u.ttft_s)
        if u.ttft_s is not None and completion > 1:
            row.tpot_s = _finite((u.e2e_s - u.ttft_s) / (completion - 1))
        if price is not None:
            c = cost(price, prompt, cached, completion, written)
            row.cost_input_usd, row.cost_cached_input_usd, row.cost_output_usd = (
                c.input_usd, c.cached_input_usd, c.output_usd)
            row.cost_cache_write_usd = c.cache_write_usd
            row.cost_usd = c.total_usd
            if cached and "prefix" not in saved:
                saved["prefix"] = {"tokens": cached, "usd": prefix_saving(price, cached)}
        if energy is not None:
            row.energy_j, row.energy_source = energy.joules, energy.source
    work = getattr(ctx, "context_work", None)
    if work is not None:
        row.context_tokens_before, row.context_tokens_after = work.before, work.after
        row.context_actions = "; ".join(work.actions) or None
        row.context_cost_usd, row.context_s = work.cost_usd, work.seconds
        removed = work.before - work.after
        if removed > 0 and price is not None and not hit and "compress" not in saved:
            saved["compress"] = {"tokens": removed, "usd": removed * price.input / 1e6}
    lint = getattr(ctx, "lint", None)
    if lint is not None:
        row.lint_units, row.lint_prefix, row.lint_potential = lint.units, lint.prefix, lint.potential
        row.lint_breaks = [b.to_dict() for b in lint.breaks]
    row.saved_by = saved
    row.saved_tokens = sum(int(v["tokens"]) for v in saved.values())
    row.saved_usd = sum(float(v["usd"]) for v in saved.values())
    return row

"""Response caches replayed: the recorded requests, oldest first, through fresh exact and semantic caches.

Each request with a stored body is looked up as the cache stage would look it up (same keys, eligibility,
cache-control and route restrictions), at its recorded arrival time (the caches' clocks are the trace's, so TTLs
hold). A hit saves what its stored answer cost to generate; a miss is answered by the recorded answer, whose
generation cost it pays, and is stored as the live stage stores it (finished answers only). Rows without a body
are carried at their recorded cost, hits included, and counted as not evaluated.

The caches start empty: a live cache that already held entries from before the window hits more than this.
For each semantic hit the verifier's p(right) is summed into an estimate of wrong hits (sum of 1 - p); a hit on
the same question (case, spacing, final ?/.) counts as right.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.cache.entry import CacheEntry
from tokenomy.cache.exact import ExactCache
from tokenomy.cache.hit_verifier import load_default, pair_features
from tokenomy.cache.key import context_key, question_key
from tokenomy.cache.semantic import SemanticCache
from tokenomy.cache.store import SQLiteStore
from tokenomy.config import CacheSettings
from tokenomy.generation import last_user_text
from tokenomy.pipeline.cache import cache_messages, cache_params
from tokenomy.pipeline.request import RequestContext
from tokenomy.tools.replay.traffic import Recorded, RowPrice, Trace

STORED_FINISH = ("stop", "length", "tool_calls")


@dataclass
class Served:
    requests: int = 0
    tokens: int = 0
    usd: float = 0.0
    est_wrong: float = 0.0


@dataclass
class CacheOutcome:
    name: str
    evaluated: int = 0
    exact: Served = field(default_factory=Served)
    semantic: Served = field(default_factory=Served)
    cost_usd: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "evaluated": self.evaluated, "cost_usd": self.cost_usd,
                "exact": vars(self.exact), "semantic": vars(self.semantic)}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _context(q: Recorded) -> RequestContext:
    assert q.prompt is not None
    return RequestContext(gen=q.prompt.gen_request(), headers=q.prompt.headers, tenant=q.row.tenant,
                          request_id=q.row.request_id)


def replay_cache(trace: Trace, settings: CacheSettings, name: str, memo: dict[str, Any] | None = None
                 ) -> CacheOutcome:
    """One pass of the trace through caches built from `settings`; `memo` ({text: vector}) is shared between
    passes so each text is embedded once."""
    clock = _Clock()
    memo = {} if memo is None else memo
    exact = None
    if settings.exact.enabled:
        e = settings.exact
        exact = ExactCache(SQLiteStore(":memory:", "exact", e.max_entries, clock=clock), ttl_s=e.ttl_s,
                           max_entries=e.max_entries, deterministic_only=e.deterministic_only)
    semantic = verifier = None
    routes = set(settings.semantic.routes) if settings.semantic.routes is not None else None
    if settings.semantic.enabled:
        s = settings.semantic
        semantic = SemanticCache(None, store=SQLiteStore(":memory:", "semantic", s.max_entries, clock=clock),
                                 threshold=s.threshold, error_budget=s.error_budget, ttl_s=s.ttl_s,
                                 max_entries=s.max_entries, min_margin=s.min_margin, clock=clock,
                                 embed_threads=s.embed_threads)
        verifier = semantic.verifier or load_default()
    out = CacheOutcome(name)
    try:
        for q in trace.requests:
            if q.prompt is None or not q.served:
                out.cost_usd += q.row.cost_usd
                continue
            out.evaluated += 1
            clock.now = q.row.ts
            hit = _lookup(q, exact, semantic, routes, memo, verifier, out)
            if hit:
                continue
            out.cost_usd += q.generation_cost
            clock.now = q.row.ts + (q.row.e2e_s or 0.0)
            _store(q, exact, semantic, routes, memo)
    finally:
        if semantic is not None:
            semantic.close()
    return out


def _eligible(ctx: RequestContext, exact: ExactCache | None, semantic: SemanticCache | None,
              routes: set[str] | None) -> tuple[bool, bool]:
    params = cache_params(ctx)
    ok = exact is not None and exact.cacheable(params)
    return ok, (semantic is not None and ok and ctx.gen.kind == "chat" and (routes is None or ctx.gen.model in routes))


def _lookup(q: Recorded, exact: ExactCache | None, semantic: SemanticCache | None, routes: set[str] | None,
            memo: dict[str, Any], verifier: Any, out: CacheOutcome) -> bool:
    ctx = _context(q)
    eligible, use_semantic = _eligible(ctx, exact, semantic, routes)
    if not eligible or "no-cache" in ctx.headers.get("cache-control", "").lower():
        return False
    msgs, params, model = cache_messages(ctx), cache_params(ctx), ctx.gen.model
    assert exact is not None
    hit = exact.lookup(ctx.tenant, model, msgs, params)
    if hit is not None:
        _count(out.exact, hit.entry)
        return True
    if not use_semantic:
        return False
    assert semantic is not None
    text = last_user_text(msgs)
    if text is None:
        return False
    decision = semantic.decide(context_key(ctx.tenant, model, msgs, params), text, memo=memo)
    if decision.hit is None:
        return False
    p = decision.score if decision.score is not None else 1.0
    same = question_key(text) == question_key(decision.candidate_text or "")
    if not same and semantic.error_budget is None and verifier is not None:    # served unverified: estimate
        p = float(verifier.probability(pair_features(text, decision.candidate_text or "", decision.similarity,
                                                     decision.second_similarity)))
    _count(out.semantic, decision.hit.entry, 0.0 if same else 1.0 - p)
    return True


def _count(served: Served, entry: CacheEntry, wrong: float = 0.0) -> None:
    served.requests += 1
    served.tokens += entry.prompt_tokens + entry.completion_tokens
    served.usd += entry.cost_usd
    served.est_wrong += wrong


def _store(q: Recorded, exact: ExactCache | None, semantic: SemanticCache | None, routes: set[str] | None,
           memo: dict[str, Any]) -> None:
    r = q.row
    ctx = _context(q)
    eligible, use_semantic = _eligible(ctx, exact, semantic, routes)
    if not eligible or "no-store" in ctx.headers.get("cache-control", "").lower():
        return
    if r.status >= 400 or r.error_code == "stream_error" or r.finish_reason not in STORED_FINISH:
        return
    entry = CacheEntry(response={"text": (q.prompt.answer if q.prompt else None) or ""}, prompt_tokens=r.prompt_tokens,
                       completion_tokens=r.completion_tokens, model=r.model or "", created_at=r.ts,
                       cost_usd=q.usage_cost(RowPrice.of(r)))
    msgs, params = cache_messages(ctx), cache_params(ctx)
    assert exact is not None
    exact.put(ctx.tenant, ctx.gen.model, msgs, params, entry)
    if use_semantic:
        assert semantic is not None
        semantic.add(ctx.tenant, ctx.gen.model, msgs, params, entry, memo=memo)


def cache_policies(trace: Trace, settings: CacheSettings, thresholds: Iterable[float]) -> list[CacheOutcome]:
    """The candidate settings, exact only, and the semantic cache at each threshold (else as the candidate's)."""
    memo: dict[str, Any] = {}
    sem = settings.semantic
    policies = [(f"candidate (exact {'on' if settings.exact.enabled else 'off'}, semantic "
                 f"{f'{sem.threshold:g}' if sem.enabled else 'off'})", settings)]
    exact_on = settings.model_copy(update={"exact": settings.exact.model_copy(update={"enabled": True})})
    policies.append(("exact only", exact_on.model_copy(update={"semantic": sem.model_copy(update={"enabled": False})})))
    for t in sorted(set(thresholds)):
        s = exact_on.model_copy(update={"semantic": sem.model_copy(update={"enabled": True, "threshold": t})})
        policies.append((f"exact + semantic {t:g}", s))
    return [replay_cache(trace, s, name, memo) for name, s in policies]

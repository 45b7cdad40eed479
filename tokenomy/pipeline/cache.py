"""Cache stage: exact, then semantic; a hit ends the request here with the stored answer.

Opt-outs ride in the request's `cache-control` header: `no-cache` skips the lookup, `no-store` skips the write.
Only finished, successful answers are stored (finish_reason stop or length); streamed answers are stored as
their text pieces and replayed as a stream with the same event shape. A cache that fails (Redis down) never
fails the request: the stores count errors and answer "miss". A hit carries the tokens and USD it saved.

Explore (``cache.semantic.explore``, docs/cache.md): a would-be semantic hit that online error control wants
checked goes to the model as a miss would; the client gets the fresh answer, the row and the
``x-tokenomy-cache`` header say ``explore`` (its cost is what the error guarantee costs), and the judge's
comparison of the cached answer with the fresh one goes back to the semantic cache (``SemanticCache.observe``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from tokenomy.cache.entry import CacheEntry, CacheHit
from tokenomy.cache.judge import Judge, same_answer
from tokenomy.cache.key import is_deterministic
from tokenomy.generation import Delta, Usage
from tokenomy.ledger.row import CacheSaving
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext, Result

log = logging.getLogger("tokenomy.cache")

CostFn = Callable[[str, Usage, bool], float]     # (model, usage, a batch request?) -> USD


def cache_messages(ctx: RequestContext) -> list[dict[str, Any]]:
    if ctx.gen.kind == "chat":
        return list(ctx.gen.messages or [])
    return [{"role": "user", "content": ctx.gen.prompt or ""}]


def cache_params(ctx: RequestContext) -> dict[str, Any]:
    """The request's parameters as the caches key them: its sampling fields, kind and structured-output fields; a
    predicted output is left out (it changes how fast an answer comes, never which)."""
    p = dict(ctx.gen.params)
    p.pop("prediction", None)
    p["kind"] = ctx.gen.kind
    for k in ("tools", "tool_choice", "response_format"):
        v = getattr(ctx.gen, k)
        if v is not None:
            p[k] = v
    return p


class Cache:
    name = "cache"

    def __init__(self, exact: Any | None, semantic: Any | None, cost: CostFn,
                 semantic_routes: set[str] | None = None, deterministic_only: bool = True,
                 judge: Judge = same_answer) -> None:
        """Either cache may be None (switched off) without the other; `deterministic_only`: only requests at
        temperature 0 or seeded are looked up and stored (cache.exact.deterministic_only); `judge` compares an
        explored entry's answer with the model's fresh one (tokenomy/cache/judge.py)."""
        self.exact = exact
        self.semantic = semantic
        self.deterministic_only = deterministic_only
        self.cost = cost
        self.judge = judge
        self.semantic_routes = semantic_routes   # None: every model and route may use the semantic cache

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        control = ctx.headers.get("cache-control", "").lower()
        lookup, store = "no-cache" not in control, "no-store" not in control
        msgs, params, model = cache_messages(ctx), cache_params(ctx), ctx.gen.model
        several = (params.get("n") or 1) > 1 or "best_of" in params     # an entry holds one answer
        on = self.exact is not None or self.semantic is not None
        deterministic = not self.deterministic_only or is_deterministic(params)
        eligible = on and deterministic and not several
        use_semantic = self.semantic is not None and eligible and ctx.gen.kind == "chat" and \
            (self.semantic_routes is None or model in self.semantic_routes)
        if not eligible:
            ctx.cache_bypass = ("disabled" if not on else "several choices" if several else "not deterministic")
        explore: CacheHit | None = None
        if eligible and lookup:
            hit, explore = await asyncio.to_thread(self._lookup, ctx, msgs, params, use_semantic)
            if hit is not None:
                self._serve(ctx, hit)
                return
            if explore is not None and explore.held_back:
                ctx.cache = "explore"
        await call_next(ctx)
        if not eligible or not (store or explore is not None):
            return
        if ctx.deltas is not None:
            ctx.deltas = self._capture(ctx, ctx.deltas, msgs, params, use_semantic, explore, store)
        elif ctx.result is not None:
            if explore is not None:
                await asyncio.to_thread(self._judge, ctx, explore, msgs, ctx.result.text, ctx.result.tool_calls)
            if store:
                self._store(ctx, msgs, params, use_semantic, ctx.result.text, None, ctx.result,
                            ctx.result.stop_sequence)

    def _lookup(self, ctx: RequestContext, msgs: list[dict[str, Any]], params: dict[str, Any],
                use_semantic: bool) -> tuple[CacheHit | None, CacheHit | None]:
        """(the hit to serve, or a would-be semantic hit to explore); at most one is set."""
        tenant, model = ctx.tenant, ctx.gen.model
        try:
            hit = self.exact.lookup(tenant, model, msgs, params) if self.exact is not None else None
            if hit is None and use_semantic:
                found = self.semantic.check(tenant, model, msgs, params, memo=ctx.vectors)
                if found is not None:
                    return found.hit, found.explore
            return hit, None
        except Exception:                         # a broken cache is a miss, never a failed request
            log.exception("cache lookup failed")
            return None, None

    def _judge(self, ctx: RequestContext, explore: CacheHit, msgs: list[dict[str, Any]], text: str,
               tool_calls: list[dict[str, Any]] | None) -> None:
        """Compare an explored entry's answer with the fresh one and tell the semantic cache; only a finished,
        successful answer is evidence."""
        if ctx.error is not None or ctx.finish_reason not in ("stop", "tool_calls") or explore.entry_id is None:
            return
        try:
            question = next((str(m.get("content")) for m in reversed(msgs) if m.get("role") == "user"), "")
            right = self.judge(question, explore.entry.response, text, tool_calls)
            self.semantic.observe(explore.entry_id, explore.score, right)
        except Exception:
            log.exception("cache explore judgement failed")

    def _serve(self, ctx: RequestContext, hit: CacheHit) -> None:
        e = hit.entry
        r = e.response
        ctx.cache = hit.kind
        ctx.model = e.model or ctx.gen.model
        ctx.route_reason = f"cache {hit.kind} hit" + (f" (similarity {hit.similarity:.3f})"
                                                        if hit.kind == "semantic" else "")
        usage = Usage(prompt_tokens=e.prompt_tokens, completion_tokens=e.completion_tokens,
                      cached_tokens=int(r.get("cached_tokens", 0)))
        ctx.usage = usage
        ctx.finish_reason = r.get("finish_reason", "stop")
        ctx.text = r.get("text", "")
        ctx.cache_saving = CacheSaving(by=hit.kind, tokens=hit.saved_tokens, usd=hit.saved_usd,
                                       similarity=hit.similarity, entry_id=hit.entry_id)
        result = Result(text=ctx.text, finish_reason=ctx.finish_reason, usage=usage,
                        tool_calls=r.get("tool_calls"), stop_sequence=r.get("stop_sequence"))
        if ctx.stream:
            pieces = e.chunks or [{"text": ctx.text}]
            ctx.deltas = _replay(pieces, result)
        else:
            ctx.result = result

    def _store(self, ctx: RequestContext, msgs: list[dict[str, Any]], params: dict[str, Any], use_semantic: bool,
               text: str, chunks: list[dict[str, Any]] | None, result: Result | None,
               stop_sequence: str | None = None) -> None:
        if ctx.error is not None or ctx.finish_reason not in ("stop", "length", "tool_calls") or ctx.usage is None:
            return
        if ctx.cache in ("exact", "semantic"):
            return
        u = ctx.usage
        entry = CacheEntry(
            response={"text": text, "finish_reason": ctx.finish_reason, "cached_tokens": u.cached_tokens,
                      "tool_calls": result.tool_calls if result is not None else None,
                      "stop_sequence": stop_sequence},
            chunks=chunks, prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
            cost_usd=self.cost(ctx.model or ctx.gen.model, u, ctx.batch_id is not None), model=ctx.model or "")
        try:
            if self.exact is not None:
                self.exact.put(ctx.tenant, ctx.gen.model, msgs, params, entry)
            if use_semantic:
                self.semantic.add(ctx.tenant, ctx.gen.model, msgs, params, entry, memo=ctx.vectors)
        except Exception:
            log.exception("cache write failed")

    async def _capture(self, ctx: RequestContext, deltas: AsyncIterator[Delta], msgs: list[dict[str, Any]],
                       params: dict[str, Any], use_semantic: bool,
                       explore: CacheHit | None = None, store: bool = True) -> AsyncIterator[Delta]:
        pieces: list[dict[str, Any]] = []
        complete = False
        stop_sequence = None
        try:
            async for d in deltas:
                if d.text or d.tool_calls:
                    pieces.append({"text": d.text, **({"tool_calls": d.tool_calls} if d.tool_calls else {})})
                if d.last and d.error is None:
                    complete, stop_sequence = True, d.stop_sequence
                yield d
        finally:
            await deltas.aclose()
        if complete:
            text = "".join(p["text"] for p in pieces)
            if explore is not None and not any(p.get("tool_calls") for p in pieces):  # streamed calls: fragments
                await asyncio.to_thread(self._judge, ctx, explore, msgs, text, None)
            if store:
                await asyncio.to_thread(self._store, ctx, msgs, params, use_semantic, text, pieces, None,
                                        stop_sequence)


async def _replay(pieces: list[dict[str, Any]], result: Result) -> AsyncIterator[Delta]:
    for p in pieces:
        yield Delta(text=p.get("text", ""), tool_calls=p.get("tool_calls"))
    yield Delta(finish_reason=result.finish_reason, usage=result.usage, stop_sequence=result.stop_sequence)

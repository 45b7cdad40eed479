"""Context stage: exact prompt token count with the target model's tokenizer, checked against the route's
context budget (over-budget requests are flagged; with `enforce: true` refused, 400 with the numbers), and the
route's context levers (`routes.<name>.context`, all off by default; docs/context.md):

    rewrite      move date/time lines of the system prompt to the end of the prompt (the lint's safe fix)
    compaction   keep conversation history under a trigger (drop_middle | summarize, tool-output masking)
    compress     compress long inputs on a small model's token surprisal, only when it pays for itself
    lint         prompt-layout lint: what breaks prefix reuse across this tenant's requests

A client opts out of rewrite, compaction and compression per request with `x-tokenomy-context: off`, and asks
for the lint's finding with `x-tokenomy-lint: on` (answered in the `x-tokenomy-lint` response header). What the
stage did is in `x-tokenomy-context` and on the ledger row (tokens before and after, its own cost).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tokenomy.backends.base import InvalidRequest
from tokenomy.config import ContextSettings, RouteSpec
from tokenomy.context import compress as cz
from tokenomy.context import window as fit
from tokenomy.context.compaction import SummaryCache, compact
from tokenomy.context.lint import PrefixTracker, header, segments, volatile_lines
from tokenomy.context.tokens import TokenCount
from tokenomy.errors import APIError
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import ContextWork, RequestContext

Counter = Callable[[str, RequestContext], TokenCount]
# (summary model, text, max tokens, a batch request?) -> (summary, USD)
Summarizer = Callable[[str, str, int, bool], Awaitable[tuple[str, float]]]
# (model name, a batch request?) -> (input USD per token, notional?)
InputPrice = Callable[[str, bool], tuple[float, bool]]
# model name -> its context window in tokens (None: not known, e.g. an upstream)
Window = Callable[[str], int | None]
SWITCH = ("on", "off")
FIT_AUTO_APIS = frozenset({"messages", "responses", "ollama.chat"})    # fit: auto fits the requests of these APIs


def _switch(ctx: RequestContext, name: str) -> str | None:
    value = ctx.headers.get(name)
    if value is None:
        return None
    v = value.strip().lower()
    if v not in SWITCH:
        raise APIError(400, f"Invalid value for header '{name}': {value!r}; use 'on' or 'off'.", param=name,
                       code="invalid_header")
    return v


class Context:
    name = "context"

    def __init__(self, count: Counter, routes: dict[str, RouteSpec], summarize: Summarizer | None = None,
                 input_price: InputPrice | None = None, on_break: Callable[[str], None] | None = None,
                 tracker: PrefixTracker | None = None, compressors: dict[str, cz.Compressor] | None = None,
                 window: Window | None = None) -> None:
        self.count = count
        self.window = window or (lambda _m: None)
        self.routes = routes
        self.summarize = summarize
        self.input_price = input_price or (lambda _m, _b: (0.0, True))
        self.on_break = on_break
        self.tracker = tracker if tracker is not None else PrefixTracker()
        self.summaries = SummaryCache()
        self.compressors = compressors if compressors is not None else {}
        self._compressors_lock = threading.Lock()   # one engine process per compressor model, however many ask
        self.prefill_s_per_token: dict[str, float] = {}   # measured per model (EWMA), for compression's decision

    def with_routes(self, routes: dict[str, RouteSpec]) -> Context:
        """This stage over other routes (a config reload): a new stage sharing this one's state (prefix tracker,
        summaries, compressors, measured prefill speeds)."""
        other = copy.copy(self)
        other.routes = routes
        return other

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        opt = _switch(ctx, "x-tokenomy-context")
        lint_asked = _switch(ctx, "x-tokenomy-lint")
        route = self.routes.get(ctx.gen.model)
        target = route.models[0] if route is not None else ctx.gen.model
        try:
            tc = self.count(target, ctx)
        except KeyError:            # unknown model: the route stage answers 404
            await call_next(ctx)
            return
        except InvalidRequest as e:
            raise APIError(400, str(e), param=e.param, code=e.code) from e
        settings = route.context if route is not None else ContextSettings()
        levers = settings.rewrite or settings.compaction is not None or settings.compress is not None
        if levers and ctx.gen.kind == "chat" and ctx.gen.messages:
            if opt == "off":
                ctx.response_headers["x-tokenomy-context"] = "off"
            else:
                tc = await self._work(ctx, settings, target, tc)
        fits = settings.fit == "on" or (settings.fit == "auto" and ctx.gen.api in FIT_AUTO_APIS)
        if fits and opt != "off" and ctx.gen.kind == "chat":
            tc = await self._fit(ctx, settings, target, tc)
        ctx.prompt_tokens, ctx.prompt_tokens_exact = tc.tokens, tc.exact
        if lint_asked == "on" or (settings.lint and lint_asked != "off"):
            self._lint(ctx, lint_asked == "on")
        if route is not None and route.context_budget is not None and tc.tokens > route.context_budget:
            ctx.over_budget = True
            if route.enforce:
                kind = "" if tc.exact else " (estimated)"
                raise APIError(400, f"The prompt is {tc.tokens} tokens{kind}; route '{ctx.gen.model}' allows "
                               f"{route.context_budget}.", param="messages", code="context_budget_exceeded")
        await call_next(ctx)
        self._measure_prefill(ctx)

    # ---- the levers ---------------------------------------------------------------------------------------
    async def _work(self, ctx: RequestContext, s: ContextSettings, target: str, tc: TokenCount) -> TokenCount:
        t0 = time.perf_counter()
        work = ContextWork(before=tc.tokens, after=tc.tokens)
        messages = list(ctx.gen.messages or [])
        if s.rewrite:
            messages = self._rewrite(messages, work)

        def count(msgs: list[dict[str, Any]]) -> int:
            probe = RequestContext(gen=dataclasses.replace(ctx.gen, messages=msgs, counted=None))
            return self.count(target, probe).tokens

        c = s.compaction
        if c is not None:
            summarize = None
            if c.strategy == "summarize" and self.summarize is not None:
                model, summarizer = c.summary_model or target, self.summarize

                async def summarize(text: str, n: int) -> tuple[str, float]:
                    return await summarizer(model, text, n, ctx.batch_id is not None)
            try:
                done = await compact(messages, c, count, summarize, self.summaries,
                                     salt=f"{c.summary_model}:{c.max_summary_tokens}")
            except Exception as e:      # a summary model that failed: drop the middle instead of failing
                fallback = c.model_copy(update={"strategy": "drop_middle"})
                done = await compact(messages, fallback, count)
                work.actions.append(f"summary failed ({type(e).__name__})")
            if done.action != "none":
                messages = done.messages
                what = f"compaction={done.action} turns={done.turns_replaced}"
                if done.tools_masked:
                    what += f" tools_masked={done.tools_masked}"
                if "summarize" in done.action:
                    what += " summary=" + ("cached" if done.summary_cached else "new")
                work.actions.append(what)
                work.cost_usd += done.cost_usd
                work.summary_calls += done.summary_calls
        if s.compress is not None:
            messages = await self._compress(messages, s.compress, target, work, ctx.batch_id is not None)
        if messages is not ctx.gen.messages and messages != ctx.gen.messages:
            ctx.gen = dataclasses.replace(ctx.gen, messages=messages, counted=None)
            tc = self.count(target, ctx)
        work.after = tc.tokens
        work.seconds = time.perf_counter() - t0
        ctx.context_work = work
        ctx.response_headers["x-tokenomy-context"] = work.header()
        return tc

    async def _fit(self, ctx: RequestContext, s: ContextSettings, target: str, tc: TokenCount) -> TokenCount:
        """Fit the request into the target model's window (context/window.py); records what it did like the levers."""
        window = self.window(target)
        if not window or not tc.exact:
            return tc
        room = min(s.fit_min_answer, window // 4)
        asked = ctx.gen.params.get("max_tokens")
        if tc.tokens + room <= window and (asked is None or tc.tokens + asked <= window):
            return tc
        t0 = time.perf_counter()
        work = ctx.context_work or ContextWork(before=tc.tokens, after=tc.tokens)
        gen = ctx.gen

        def count(g: Any) -> TokenCount:
            return self.count(target, RequestContext(gen=g))

        if tc.tokens + room > window and gen.tools:
            briefer = dataclasses.replace(gen, tools=fit.brief_tools(gen.tools), counted=None)
            tc, gen = count(briefer), briefer
            work.actions.append("fit=tools described briefly")
        if tc.tokens + room > window and gen.messages:
            base = gen

            def count_messages(msgs: list[dict[str, Any]]) -> int:
                return count(dataclasses.replace(base, messages=msgs, counted=None)).tokens

            messages, dropped = await fit.fit_turns(list(gen.messages), window - room, count_messages)
            if dropped:
                gen = dataclasses.replace(gen, messages=messages, counted=None)
                tc = count(gen)
                work.actions.append(f"fit=dropped {dropped} oldest turn(s)")
        if tc.tokens + room > window and gen.messages:
            base = gen
            messages, cut = fit.cut_middle(list(gen.messages), window - room, lambda msgs: count(
                dataclasses.replace(base, messages=msgs, counted=None)).tokens)
            if cut:
                gen = dataclasses.replace(gen, messages=messages, counted=None)
                tc = count(gen)
                work.actions.append(f"fit=cut {cut} characters")
        left = window - tc.tokens
        if asked is not None and tc.tokens + asked > window and left > 0:
            gen = dataclasses.replace(gen, params={**gen.params, "max_tokens": left})
            work.actions.append(f"fit=max_tokens {asked}->{left}")
        if gen is not ctx.gen:
            if gen.messages is not ctx.gen.messages or gen.tools is not ctx.gen.tools:
                tc = self.count(target, RequestContext(gen=gen))     # leaves its ids for the backend to reuse
            ctx.gen = gen
        work.after = tc.tokens
        work.seconds += time.perf_counter() - t0
        ctx.context_work = work
        ctx.response_headers["x-tokenomy-context"] = work.header()
        return tc

    def _rewrite(self, messages: list[dict[str, Any]], work: ContextWork) -> list[dict[str, Any]]:
        """Date/time lines of the system prompt go to the end of the last user message (the safe case only:
        whole short lines, plain-text contents)."""
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        if last_user < 0 or not isinstance(messages[last_user].get("content"), str):
            return messages
        out, moved = [], []
        for m in messages:
            if m.get("role") in ("system", "developer") and isinstance(m.get("content"), str):
                text, lines = volatile_lines(m["content"])
                if lines:
                    m = {**m, "content": text}
                    moved += lines
            out.append(m)
        if not moved:
            return messages
        u = out[last_user]
        out[last_user] = {**u, "content": f"{u['content']}\n\n" + "\n".join(moved)}
        work.actions.append(f"rewrite=moved {len(moved)} volatile line(s) to the end")
        return out

    def close(self) -> None:
        """Stop the compressors' engine processes."""
        for comp in self.compressors.values():
            comp.scorer.close()
        self.compressors.clear()

    def compressor(self, model: str) -> cz.Compressor:
        """The calibrated compressor for `model`, started on first use (from a worker thread: requests that ask
        together wait for the one start, and none sees it before its calibration)."""
        with self._compressors_lock:
            comp = self.compressors.get(model)
            if comp is None:
                comp = cz.Compressor(cz.Scorer(model))
                try:
                    comp.calibrate()
                except BaseException:
                    comp.scorer.close()
                    raise
                self.compressors[model] = comp
            return comp

    async def _compress(self, messages: list[dict[str, Any]], s: Any, target: str, work: ContextWork,
                        batch: bool) -> list[dict[str, Any]]:
        comp = await asyncio.to_thread(self.compressor, s.model)
        parts = await asyncio.to_thread(cz.long_parts, messages, s.protect, s.min_tokens, comp.scorer.count)
        tokens = sum(comp.scorer.count(p.text) for ps in parts for p in ps if not p.protected)
        if tokens == 0:
            return messages
        price, notional = self.input_price(target, batch)
        comp_price, _ = self.input_price(s.model, batch)
        decision = cz.decide(tokens, s.target_ratio, cz.Costs(
            compressor_s_per_token=comp.s_per_token or 0.0,
            target_prefill_s_per_token=self.prefill_s_per_token.get(target),
            target_usd_per_token=0.0 if notional else price, compressor_usd_per_token=comp_price))
        work.compress_decision = str(decision)
        if not decision.run:
            work.actions.append("compress=skipped (would not pay for itself)")
            return messages
        res = await asyncio.to_thread(cz.compress_messages, messages, comp.scorer, s.target_ratio, s.protect,
                                      s.min_tokens, parts)
        comp.observe(res.seconds, res.tokens_read)
        work.cost_usd += res.tokens_read * comp_price
        work.compress_seconds += res.seconds
        work.compress_removed += res.tokens_removed
        work.actions.append(f"compress={res.tokens_read}->{res.tokens_read - res.tokens_removed}")
        return res.messages

    def _measure_prefill(self, ctx: RequestContext) -> None:
        """Prefill seconds per uncached prompt token of the model that served (an EWMA), from finished answers."""
        u, model = ctx.usage, ctx.model
        if u is None or model is None or u.ttft_s is None or u.counted:
            return
        fresh = u.prompt_tokens - u.cached_tokens
        if fresh < 64:
            return
        rate = max(u.ttft_s - u.queue_s, 0.0) / fresh
        old = self.prefill_s_per_token.get(model)
        self.prefill_s_per_token[model] = rate if old is None else 0.8 * old + 0.2 * rate

    # ---- lint ---------------------------------------------------------------------------------------------
    def _lint(self, ctx: RequestContext, answer: bool) -> None:
        g = ctx.gen
        finding = self.tracker.observe(ctx.tenant, g.model, segments(g.messages, g.tools, g.prompt))
        ctx.lint = finding
        if self.on_break is not None:
            for b in finding.breaks:
                self.on_break(b.reason)
        if answer:
            ctx.response_headers["x-tokenomy-lint"] = header(finding)

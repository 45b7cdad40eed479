"""Record stage: runs for every request (errors and early endings too) once its answer is complete.

For streams that is when the last delta has been sent (or the client went away), so the record wraps the stream.
The record observes; it never changes a response. It starts the request's trace (with a tracer; telemetry/trace.py)
and finishes it after the sinks, so the ledger row carries the trace id; with OTel metrics on it hands the request
to them too (telemetry/otel_metrics.py), with the times it computed for Prometheus.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tokenomy.errors import APIError
from tokenomy.generation import Delta, Usage
from tokenomy.ledger.row import CACHE_HITS
from tokenomy.metrics.prometheus import Metrics
from tokenomy.pipeline.chain import Next
from tokenomy.pipeline.request import RequestContext
from tokenomy.telemetry import trace
from tokenomy.telemetry.otel_metrics import OtelMetrics

log = logging.getLogger("tokenomy.record")

CLIENT_CLOSED = 499     # nginx's status for a client that closed the connection before the answer was complete

Sink = Callable[[RequestContext], None]


class Record:
    name = "record"
    traced = False            # its span is its finish, made by the trace itself

    def __init__(self, metrics: Metrics, sinks: list[Sink] | None = None,
                 durable: Callable[[], Awaitable[Any]] | None = None, tracer: trace.Tracer | None = None,
                 otel: OtelMetrics | None = None) -> None:
        self.metrics = metrics
        self.sinks = sinks or []
        self.durable = durable    # awaited after the sinks, before the answer's last byte (ledger_durable)
        self.tracer = tracer      # None: tracing is off
        self.otel = otel          # None: OTel metrics are off

    def _begin(self, ctx: RequestContext) -> None:
        if self.tracer is not None:
            try:
                self.tracer.start(ctx)
            except Exception:       # tracing never fails a request
                log.exception("starting the request's trace failed")
        else:
            parent = ctx.headers.get("traceparent")
            if parent:
                ctx.trace_id = trace.trace_id_of(parent)

    async def __call__(self, ctx: RequestContext, call_next: Next) -> None:
        self._begin(ctx)
        try:
            await call_next(ctx)
        except APIError as e:
            ctx.error, ctx.status = e, e.status
            self.finish(ctx)
            await self._commit()
            raise
        except BaseException as e:  # cancelled (client gone) or a bug: still one record
            if isinstance(e, Exception):
                ctx.error, ctx.status = APIError(500, f"internal error: {type(e).__name__}"), 500
            else:
                ctx.finish_reason = ctx.finish_reason or "cancelled"
            self.finish(ctx)
            raise
        if ctx.deltas is not None:
            ctx.deltas = self._wrap(ctx.deltas, ctx)
        else:
            self.finish(ctx)
            await self._commit()

    async def _wrap(self, deltas: AsyncIterator[Delta], ctx: RequestContext) -> AsyncIterator[Delta]:
        try:
            async for d in deltas:
                yield d
        finally:
            if ctx.finish_reason is None:
                ctx.finish_reason = "cancelled"
            self.finish(ctx)
        await self._commit()          # only a stream that ran to its end: its [DONE] follows

    async def _commit(self) -> None:
        if self.durable is not None:
            try:
                await self.durable()
            except Exception:
                log.exception("durable ledger commit failed")

    def finish(self, ctx: RequestContext) -> None:
        started = time.perf_counter()
        if ctx.trace is None and ctx.trace_id is None:      # refused before the pipeline (gateway.refused)
            self._begin(ctx)
        if ctx.finish_reason == "cancelled" and ctx.error is None:
            ctx.status = CLIENT_CLOSED
            ctx.model = ctx.model or ctx.serving
            if ctx.usage is None and ctx.model is not None:
                # the client left: what a model already did for it is billed and counted against its limits
                ctx.usage = Usage(prompt_tokens=ctx.prompt_tokens or 0,
                                  completion_tokens=ctx.seen_tokens, counted=True,
                                  e2e_s=time.perf_counter() - ctx.started)
        m, model = self.metrics, self.metrics.label(ctx.model or ctx.asked_model)
        if ctx.error is not None or ctx.finish_reason == "error":
            status = "error"
        else:
            status = "cancelled" if ctx.finish_reason == "cancelled" else "ok"
        m.requests.labels(status, model, ctx.api).inc()
        m.tenant_requests.labels(ctx.tenant).inc()
        if ctx.gen.kind != "embedding":
            m.cache_requests.labels(model, ctx.cache).inc()
        u, tpot = ctx.usage, None
        if u is not None:
            for name, part in u.parts or [(None, u)]:     # an answer several models wrote: each its own
                by = model if name is None else m.label(name)
                m.tokens.labels("prompt", by).inc(part.prompt_tokens)
                m.tokens.labels("cached", by).inc(part.cached_tokens)
                if part.cache_write_tokens:     # only upstreams with a prompt cache of their own report writes
                    m.tokens.labels("cache_write", by).inc(part.cache_write_tokens)
                m.tokens.labels("completion", by).inc(part.completion_tokens)
            m.e2e.labels(model).observe(u.e2e_s)
            m.queue_wait.labels(model).observe(max(u.queue_s, 0.0))
            gaps = 0
            if u.ttft_s is not None:
                m.ttft.labels(model).observe(u.ttft_s)
                # several choices (n, best_of) decode side by side: a choice's tokens set the time per token
                choices = ctx.gen.params.get("best_of") or ctx.gen.params.get("n") or 1
                per_choice = u.completion_tokens / choices
                if per_choice > 1:
                    tpot, gaps = (u.e2e_s - u.ttft_s) / (per_choice - 1), int(u.completion_tokens - choices)
                    m.tpot.labels(model).observe(tpot)
            if m.vllm is not None:
                self._engine_requests(ctx, tpot, gaps)
        if ctx.error is not None and ctx.error.status == 429:
            m.rejections.labels(ctx.error.code or "rate_limit").inc()
        if ctx.finish_reason == "length" and cut_inside_json(ctx):
            m.schema_cut.labels(model).inc()
            ctx.schema_problem = ctx.schema_problem or "cut at max_tokens inside the JSON"
        for sink in self.sinks:
            try:
                sink(ctx)
            except Exception:       # a broken sink must never break the request path
                log.exception("record sink failed")
        if self.otel is not None:
            try:
                self.otel.record(ctx, started - ctx.started, tpot)
            except Exception:       # metrics never fail a request
                log.exception("recording the request's OTel metrics failed")
        if ctx.trace is not None:
            try:
                ctx.trace.finish(ctx, started)
            except Exception:
                log.exception("finishing the request's trace failed")

    def _engine_requests(self, ctx: RequestContext, tpot: float | None, gaps: int) -> None:
        """vLLM's per-request families (metrics/vllm.py) for what embedded engines ran for this request: its
        answer (not a response-cache hit), each part of a token-routed answer (tokens only), discarded cascade
        answers."""
        vllm, u = self.metrics.vllm, ctx.usage
        assert vllm is not None and u is not None
        if ctx.cache not in CACHE_HITS:
            if u.parts:
                for name, part in u.parts:
                    if name in vllm.models:
                        vllm.tokens(name, part.prompt_tokens, part.completion_tokens)
            elif ctx.model in vllm.models:
                vllm.request(ctx.model, u, ctx.finish_reason, tpot, gaps)
        for name, usage in ctx.escalations:
            if name in vllm.models:
                vllm.request(name, usage, "stop")


def cut_inside_json(ctx: RequestContext) -> bool:
    """The request asked for JSON (``response_format`` json_schema or json_object) and its text does not parse."""
    fmt = ctx.gen.response_format
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        return False
    try:
        json.loads(ctx.text)
    except ValueError:
        return True
    return False

"""Traces: one OpenTelemetry span per request in the GenAI semantic conventions, its stages and upstream calls as
children (docs/telemetry.md).

    {operation} {model}               SERVER    the request, from arrival to its record (gen_ai.*, tokenomy.*)
      admit, context, cache, route    INTERNAL  each stage's own work: from entering it to handing on
      generate (embed)                INTERNAL  to the answer's end (a stream's last event)
        {operation} {upstream model}  CLIENT    one per upstream call; its `traceparent` goes with the call
        {operation} {model}           INTERNAL  the embedded engine's answer, and inside it
          queue, prefill, decode      INTERNAL  from the engine's own timings (Usage), made after the fact
      record                          INTERNAL  the ledger row, metrics and limits

An incoming W3C `traceparent` is continued; without one the trace starts here. The trace id is on the request's
ledger row (`trace_id`), so a bill line leads to its trace; with tracing off an incoming traceparent's trace id is
still recorded there, and nothing else of this module runs: no span object is made.

Tracing is on with `telemetry.traces: true`, or with `traces` left null and an OTLP endpoint in the standard
environment variables; OTEL_SDK_DISABLED=true turns it off. Spans go through the SDK's BatchSpanProcessor to its
OTLP/HTTP exporter, on the processor's own thread: a collector that is down loses spans, never a request.

The stages do not call this module: the pipeline's chain runs each stage inside `RequestTrace.stage`, the record
stage starts and finishes the request's trace, and a backend hands its calls to `client_stream` / `client_call`
and the engine's timings to `engine`, with the parent it finds in `GenRequest.trace` (None: not traced).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tokenomy.generation import Delta, GenRequest, Usage

log = logging.getLogger("tokenomy.trace")

OPERATIONS = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}
PROVIDERS = {"embedded": "tokenomy", "openai": "openai", "anthropic": "anthropic"}
# the id the client sees in the answer, per API (dialect/*wire.py make them from the request id the same way)
RESPONSE_PREFIX = {"chat.completions": "chatcmpl-", "completions": "cmpl-", "messages": "msg_", "responses": "resp_"}
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def trace_id_of(traceparent: str) -> str | None:
    """The trace id (32 hex digits) of a W3C traceparent header, None when it is not one (or the all-zero id)."""
    m = _TRACEPARENT.match(traceparent.strip().lower())
    return m.group(1) if m and m.group(1) != "0" * 32 else None


# ---- settings ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceSettings:
    """What the tracer runs with, the config file's `telemetry` resolved against the OTEL_* environment."""

    endpoint: str
    sample_ratio: float | None          # None: the SDK's sampler from OTEL_TRACES_SAMPLER (default: all)
    service_name: str
    capture_content: bool
    timeout_s: float


def resolve(telemetry: Any, env: Mapping[str, str] | None = None) -> TraceSettings | None:
    """The trace settings for a config's `telemetry` section, or None when tracing is off: `traces: false`,
    OTEL_SDK_DISABLED=true, or `traces` null and no OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT set (OTEL_TRACES_EXPORTER
    `none` also turns the environment's endpoint off). A value in the file wins over the environment's."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or telemetry.traces is False:
        return None
    traces_env = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_env = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    exporter_off = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
    if telemetry.traces is None and (exporter_off or not (traces_env or base_env)):
        return None
    endpoint = (telemetry.endpoint or traces_env
                or (base_env.rstrip("/") + "/v1/traces" if base_env else DEFAULT_ENDPOINT))
    return TraceSettings(endpoint=endpoint, sample_ratio=telemetry.sample_ratio,
                         service_name=telemetry.service_name or env.get("OTEL_SERVICE_NAME") or "tokenomy",
                         capture_content=telemetry.capture_content, timeout_s=telemetry.timeout_s)


# ---- the tracer ---------------------------------------------------------------------------------------------------

class Tracer:
    """One gateway's tracer: its own SDK TracerProvider (never the process-global one, so two gateways in one
    process trace apart), the batch processor and exporter, the model -> provider names, and whose content may be
    recorded (`content(tenant)`: the ledger's store_prompts rule; only with `capture_content`)."""

    def __init__(self, settings: TraceSettings, providers: Mapping[str, str],
                 content: Callable[[str], bool] | None = None, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from tokenomy import __version__

        self.settings = settings
        self.providers = dict(providers)
        self.content = content if settings.capture_content else None
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio)) if settings.sample_ratio is not None else None
        self.provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}),
                                       sampler=sampler)
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.timeout_s)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.otel = self.provider.get_tracer("tokenomy", __version__)
        self.propagator = TraceContextTextMapPropagator()
        log.info("traces go to %s as service %s", settings.endpoint, settings.service_name)

    def start(self, ctx: Any) -> None:
        """Start the request's span (continuing the caller's traceparent, if any): sets `ctx.trace` and
        `ctx.trace_id`. The span starts at the request's arrival (`ctx.started`)."""
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(ctx.headers) if "traceparent" in ctx.headers else None
        kind = SpanKind.INTERNAL if getattr(ctx, "batch_id", None) else SpanKind.SERVER
        name = f"{OPERATIONS.get(ctx.gen.kind, ctx.gen.kind)} {ctx.gen.model}".rstrip()
        root = self.otel.start_span(name, context=parent, kind=kind, start_time=_ns(ctx.started))
        ctx.trace = RequestTrace(self, root)
        ctx.trace_id = format(root.get_span_context().trace_id, "032x")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every ended span now; False when that did not finish within `timeout_s`."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


class SpanRef:
    """A span the layers below may hang their spans under (`GenRequest.trace`)."""

    __slots__ = ("tracer", "span")

    def __init__(self, tracer: Tracer, span: Any) -> None:
        self.tracer, self.span = tracer, span

    def child(self, name: str, kind: Any = None, start_ns: int | None = None,
              attributes: Mapping[str, Any] | None = None) -> Any:
        from opentelemetry.trace import SpanKind, set_span_in_context

        return self.tracer.otel.start_span(name, context=set_span_in_context(self.span),
                                           kind=SpanKind.INTERNAL if kind is None else kind,
                                           start_time=start_ns, attributes=attributes)


class RequestTrace(SpanRef):
    """One request's trace: its span, the stage spans still at work (a stage that hands on a stream works until
    the stream ends), and whether the sampler kept it (an unsampled trace still propagates, with no spans)."""

    __slots__ = ("open", "recording")

    def __init__(self, tracer: Tracer, root: Any) -> None:
        super().__init__(tracer, root)
        self.open: list[tuple[str, Any]] = []
        self.recording = root.is_recording()

    async def stage(self, stage: Any, ctx: Any, call_next: Callable[[Any], Awaitable[None]]) -> None:
        """Run a pipeline stage inside its span: the span ends when the stage hands on (or returns, or raises), or
        when the request ends if the stage leaves an answer streaming; the stage's backends see it as the parent
        of their spans."""
        if not self.recording:          # not sampled: no spans, but upstreams still learn the trace
            ctx.gen.trace = self
            await stage(ctx, call_next)
            return
        name = stage.name
        span = self.child(name)
        handed = False

        async def hand_on(c: Any) -> None:
            nonlocal handed
            if not handed:
                handed = True
                self._stage_done(name, span, c)
            await call_next(c)

        ctx.gen.trace = SpanRef(self.tracer, span)
        try:
            await stage(ctx, hand_on)
        except BaseException as e:
            if not handed:
                _failed(span, e)
                self._stage_done(name, span, ctx)
            raise
        if not handed:
            self._stage_done(name, span, ctx)

    def _stage_done(self, name: str, span: Any, ctx: Any) -> None:
        span.set_attributes(_stage_attributes(name, ctx))
        if ctx.deltas is not None:     # its answer is still streaming: at work until the stream ends
            self.open.append((name, span))
        else:
            span.end()

    def finish(self, ctx: Any, record_started: float) -> None:
        """End the request's trace: the stages still at work, the record stage's span (from `record_started`, a
        perf_counter time), and the request's span with its attributes."""
        if not self.recording:
            return
        for name, span in self.open:
            span.set_attributes(_stage_attributes(name, ctx))
            span.end()
        self.open = []
        self.child("record", start_ns=_ns(record_started)).end()
        root = self.span
        provider = self.tracer.providers.get(ctx.model or "", "tokenomy")
        attrs = request_attributes(ctx.gen, provider, stream=ctx.stream)
        attrs.update(_answer_attributes(ctx))
        content = self.tracer.content
        if content is not None and content(ctx.tenant):
            attrs.update(content_attributes(ctx))
        root.set_attributes(attrs)
        error = _error_type(ctx)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            root.set_attribute("error.type", error)
            root.set_status(Status(StatusCode.ERROR, ctx.error.message[:200] if ctx.error is not None else error))
        root.end()


# ---- backends: upstream calls and the engine ----------------------------------------------------------------

class Call:
    """One upstream call's CLIENT span; `headers` carry its traceparent to the upstream."""

    __slots__ = ("span", "headers", "finishes", "usage")

    def __init__(self, parent: SpanRef, operation: str, model: str, provider: str, url: str,
                 req: GenRequest) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        attrs = request_attributes(req, provider, model=model, operation=operation)
        where = urlsplit(url)
        if where.hostname:
            attrs["server.address"] = where.hostname
            attrs["server.port"] = where.port or (443 if where.scheme == "https" else 80)
        self.span = parent.child(f"{operation} {model}", kind=SpanKind.CLIENT, attributes=attrs)
        self.headers: dict[str, str] = {}
        parent.tracer.propagator.inject(self.headers, context=set_span_in_context(self.span))
        self.finishes: list[str] = []
        self.usage: Usage | None = None

    def see(self, d: Delta) -> Delta:
        if d.finish_reason is not None:
            self.finishes.append(d.finish_reason)
        if d.usage is not None:
            self.usage = d.usage
        return d

    def end(self, error: BaseException | None = None) -> None:
        if self.usage is not None:
            self.span.set_attributes(usage_attributes(self.usage))
        if self.finishes:
            self.span.set_attribute("gen_ai.response.finish_reasons", self.finishes)
        if error is not None:
            _failed(self.span, error)
        self.span.end()


def client_stream(parent: SpanRef | None, make: Callable[[dict[str, str] | None], AsyncIterator[Delta]],
                  req: GenRequest, provider: str, model: str, url: str) -> AsyncIterator[Delta]:
    """An upstream's answer stream, `make(headers)`, inside a CLIENT span when `parent` is set (else `make(None)`
    itself): `headers` (the traceparent) go on every HTTP request of the call, retries included."""
    if parent is None:
        return make(None)
    if not _recording(parent):
        return make(_headers(parent))
    return _traced_stream(Call(parent, OPERATIONS.get(req.kind, req.kind), model, provider, url, req), make)


async def _traced_stream(call: Call, make: Callable[[dict[str, str] | None], AsyncIterator[Delta]]
                         ) -> AsyncIterator[Delta]:
    inner = make(call.headers)
    try:
        async for d in inner:
            yield call.see(d)
    except BaseException as e:
        call.end(e)
        raise
    finally:
        await inner.aclose()
    call.end()


async def client_call(parent: SpanRef | None, make: Callable[[dict[str, str] | None], Awaitable[Any]],
                      req: GenRequest, provider: str, model: str, url: str) -> Any:
    """`client_stream` for a call with one answer (an embeddings request): `await make(headers)`; its `usage`, if
    it has one, is recorded."""
    if parent is None or not _recording(parent):
        return await make(None if parent is None else _headers(parent))
    call = Call(parent, OPERATIONS.get(req.kind, req.kind), model, provider, url, req)
    try:
        out = await make(call.headers)
    except BaseException as e:
        call.end(e)
        raise
    call.usage = getattr(out, "usage", None)
    call.end()
    return out


def engine(parent: SpanRef | None, req: GenRequest, model: str, started: float, arrival: float,
           usage: Usage) -> None:
    """The embedded engine's answer as spans, made after the fact from its timings: the inference (INTERNAL, from
    `started`, when the backend took the request, to now) and inside it the queue wait (from `arrival` at the
    engine to its first step), the prefill (to the first token) and the decode (to the end). Times are
    perf_counter seconds; the usage's queue_s and ttft_s count from `arrival`."""
    if parent is None or not _recording(parent):
        return
    from opentelemetry.trace import SpanKind

    end = _ns(time.perf_counter())
    at = _ns(arrival)
    operation = OPERATIONS.get(req.kind, req.kind)
    attrs = request_attributes(req, "tokenomy", model=model, operation=operation)
    attrs.update(usage_attributes(usage))
    attrs["gen_ai.response.model"] = model
    inference = parent.child(f"{operation} {model}", kind=SpanKind.INTERNAL, start_ns=_ns(started),
                             attributes=attrs)
    ref = SpanRef(parent.tracer, inference)
    scheduled = min(at + int(max(usage.queue_s, 0.0) * 1e9), end)
    first = min(max(at + int(usage.ttft_s * 1e9), scheduled), end) if usage.ttft_s is not None else end
    ref.child("queue", start_ns=at).end(end_time=scheduled)
    ref.child("prefill", start_ns=scheduled, attributes={
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
        "tokenomy.engine.prefilled_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0)}).end(end_time=first)
    if usage.ttft_s is not None:
        decode = {"gen_ai.usage.output_tokens": usage.completion_tokens}
        if usage.draft_tokens:
            decode["tokenomy.engine.draft_tokens"] = usage.draft_tokens
            decode["tokenomy.engine.draft_accepted"] = usage.draft_accepted or 0
        ref.child("decode", start_ns=first, attributes=decode).end(end_time=end)
    inference.end(end_time=end)


def _recording(parent: SpanRef) -> bool:
    return parent.span.is_recording()


def _headers(parent: SpanRef) -> dict[str, str]:
    """The traceparent of an unsampled trace: the upstream learns the trace and that it is not sampled."""
    from opentelemetry.trace import set_span_in_context

    headers: dict[str, str] = {}
    parent.tracer.propagator.inject(headers, context=set_span_in_context(parent.span))
    return headers


# ---- attributes -----------------------------------------------------------------------------------------------

def request_attributes(gen: GenRequest, provider: str, model: str | None = None, operation: str | None = None,
                       stream: bool | None = None) -> dict[str, Any]:
    """gen_ai.operation.name, gen_ai.provider.name and the gen_ai.request.* attributes of a request."""
    p = gen.params
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation or OPERATIONS.get(gen.kind, gen.kind),
                             "gen_ai.provider.name": provider, "gen_ai.request.model": model or gen.model}
    for key, name in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                      ("seed", "seed"), ("top_k", "top_k"), ("frequency_penalty", "frequency_penalty"),
                      ("presence_penalty", "presence_penalty")):
        v = p.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            attrs["gen_ai.request." + name] = v
    n = p.get("n")
    if isinstance(n, int) and n != 1:
        attrs["gen_ai.request.choice.count"] = n
    stop = p.get("stop")
    if stop:
        attrs["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if gen.kind != "embedding":
        attrs["gen_ai.request.stream"] = gen.stream if stream is None else stream
    return attrs


def usage_attributes(u: Usage) -> dict[str, Any]:
    attrs = {"gen_ai.usage.input_tokens": u.prompt_tokens, "gen_ai.usage.output_tokens": u.completion_tokens,
             "gen_ai.usage.cache_read.input_tokens": u.cached_tokens}
    if u.cache_write_tokens:
        attrs["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write_tokens
    return attrs


def _answer_attributes(ctx: Any) -> dict[str, Any]:
    """The request span's gen_ai.response.* and gen_ai.usage.* attributes and tokenomy's own."""
    attrs: dict[str, Any] = {"tokenomy.request_id": ctx.request_id, "tokenomy.tenant": ctx.tenant,
                             "tokenomy.api": ctx.gen.api, "tokenomy.cache": ctx.cache,
                             "http.response.status_code": ctx.status if ctx.error is None else ctx.error.status}
    prefix = RESPONSE_PREFIX.get(ctx.gen.api)
    if prefix is not None:
        attrs["gen_ai.response.id"] = prefix + ctx.request_id.removeprefix("req_")
    if ctx.route is not None:
        attrs["tokenomy.route"] = ctx.route
    if ctx.key_id is not None:
        attrs["tokenomy.key_id"] = ctx.key_id
    if ctx.model:
        attrs["gen_ai.response.model"] = ctx.model
    result = ctx.result
    reasons = [c.finish_reason for c in result.all_choices] if result is not None else (
        [ctx.finish_reason] if ctx.finish_reason else [])
    if reasons:
        attrs["gen_ai.response.finish_reasons"] = reasons
    if ctx.usage is not None:
        attrs.update(usage_attributes(ctx.usage))
    if ctx.cost_usd:
        attrs["tokenomy.cost_usd"] = ctx.cost_usd
    return attrs


def _stage_attributes(name: str, ctx: Any) -> dict[str, Any]:
    """What a stage decided, as its span says it."""
    if name == "admit":
        return {"tokenomy.tenant": ctx.tenant, **({"tokenomy.key_id": ctx.key_id} if ctx.key_id else {})}
    if name == "context":
        attrs: dict[str, Any] = {"tokenomy.context.over_budget": bool(ctx.over_budget)}
        if ctx.prompt_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = ctx.prompt_tokens
        work = ctx.context_work
        if work is not None:
            attrs.update({"tokenomy.context.tokens_before": work.before, "tokenomy.context.tokens_after": work.after,
                          "tokenomy.context.actions": list(work.actions)})
        return attrs
    if name == "cache":
        outcome = "bypass" if ctx.cache == "miss" and ctx.cache_bypass else ctx.cache
        attrs = {"tokenomy.cache.outcome": outcome}
        if ctx.cache_bypass and outcome == "bypass":
            attrs["tokenomy.cache.bypass"] = ctx.cache_bypass
        saving = ctx.cache_saving
        if saving is not None:
            attrs["tokenomy.cache.saved_tokens"] = saving.tokens
            if saving.similarity is not None:
                attrs["tokenomy.cache.similarity"] = saving.similarity
        return attrs
    if name == "route":
        d = ctx.route_decision
        if d is None:
            return {}
        attrs = {"tokenomy.route.chosen": d.chosen, "tokenomy.route.by": d.by,
                 "tokenomy.route.candidates": list(d.candidates)}
        if d.route is not None:
            attrs["tokenomy.route"] = d.route
        return attrs
    if name in ("generate", "embed"):
        attrs = {"tokenomy.attempts": [f"{a['model']}: {a['outcome']}" for a in ctx.attempts]}
        if ctx.model:
            attrs["gen_ai.response.model"] = ctx.model
        return attrs
    return {}


def content_attributes(ctx: Any) -> dict[str, str]:
    """gen_ai.input.messages and gen_ai.output.messages (JSON, the conventions' message shape) of a request."""
    gen = ctx.gen
    if gen.kind == "embedding":
        return {}
    if gen.messages is not None:
        inputs = [{"role": m.get("role", "user"), "parts": _parts(m)} for m in gen.messages]
    else:
        inputs = [{"role": "user", "parts": [{"type": "text", "content": gen.prompt or ""}]}]
    attrs = {"gen_ai.input.messages": json.dumps(inputs, ensure_ascii=False)}
    choices = ctx.result.all_choices if ctx.result is not None else None
    if choices is not None:
        outputs = [_output(c.text, c.tool_calls, c.finish_reason) for c in choices]
    elif ctx.usage is not None or ctx.text:
        outputs = [_output(ctx.text, None, ctx.finish_reason)]
    else:
        return attrs
    attrs["gen_ai.output.messages"] = json.dumps(outputs, ensure_ascii=False)
    return attrs


def _parts(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append({"type": "text", "content": p["text"]})
            elif isinstance(p, dict):
                parts.append({"type": str(p.get("type", "unknown"))})
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                      "arguments": fn.get("arguments")})
    if m.get("role") == "tool" and parts and parts[0]["type"] == "text":
        parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": parts[0]["content"]}]
    return parts


def _output(text: str, tool_calls: list[dict[str, Any]] | None, finish: str | None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    for call in tool_calls or []:
        fn = call.get("function") or {}
        parts.append({"type": "tool_call", "id": call.get("id"), "name": fn.get("name"),
                      "arguments": fn.get("arguments")})
    return {"role": "assistant", "parts": parts, "finish_reason": finish or ""}


def _error_type(ctx: Any) -> str | None:
    """error.type of a request that failed: its error's code (else its HTTP status), `stream_error` for a stream
    that failed after its 200, `cancelled` when the client left; None when it succeeded."""
    if ctx.error is not None:
        return ctx.error.code or str(ctx.error.status)
    if ctx.stream_error:
        return "stream_error"
    if ctx.finish_reason == "error":
        return "error"
    if ctx.finish_reason == "cancelled":
        return "cancelled"
    return None


def _failed(span: Any, e: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    if isinstance(e, GeneratorExit) or type(e).__name__ == "CancelledError":
        kind = "cancelled"
    else:       # an APIError's code (rate_limit_exceeded, model_not_found ...), else the exception's class
        kind = getattr(e, "code", None) or type(e).__name__
    span.set_attribute("error.type", str(kind))
    span.set_status(Status(StatusCode.ERROR, str(e)[:200] or kind))


def _ns(perf: float) -> int:
    """A perf_counter time as UNIX nanoseconds (span timestamps)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


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

The request path only records: a span is its name, kind, parent span and perf_counter times, and what it says is
read later (`Span.reads`, a function of the finished request's context: `_request_reads`, `_stage_reads`,
`_call_reads` ...). The finished request's trace goes to the processor whole, with its context; the processor's
thread draws the span ids (an upstream call's is drawn on the request path, for its `traceparent`), reads the
attributes (meter/span_attributes.py), writes OTLP (meter/otlp.py) and the exporter's HTTP client sends it; the
exported trace then lets go of its spans and context. Neither side uses the SDK's span objects or its encoder:
a traced request has eight spans or more and the issue allows it 0.2 ms (docs/telemetry.md, "How spans are
built" and "What it costs").

The stages do not call this module: the pipeline's chain tells the request's trace when each stage starts and
returns (`RequestTrace.enter` / `left`; a stage's span ends when the next one starts, `handed`), the record stage
starts and finishes the request's trace, and a backend hands its calls to `client_stream` / `client_call` and the
engine's timings to `engine`, with the parent it finds in `GenRequest.trace` (None: not traced).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.meter import otlp
from tokenomy.meter.span_attributes import (
    OPERATIONS,
    answer_attributes,
    content_attributes,
    error_type,
    request_attributes,
    stage_attributes,
    usage_attributes,
)

log = logging.getLogger("tokenomy.trace")

PROVIDERS = {"embedded": "tokenomy", "openai": "openai", "anthropic": "anthropic"}
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)")


def trace_id_of(traceparent: str) -> str | None:
    """The trace id (32 hex digits) of a W3C traceparent header, None when it is not a valid one."""
    caller = _parse(traceparent)
    return caller[0] if caller is not None else None


# ---- settings ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceSettings:
    """What the tracer runs with, the config file's `telemetry` resolved against the OTEL_* environment."""

    endpoint: str
    sampler: tuple[bool, float]         # (follow a caller's sampled flag?, share of the traces started here kept)
    service_name: str
    capture_content: bool
    timeout_s: float


# OTEL_TRACES_SAMPLER's values (the SDK's names) -> (parent-based, ratio or None: OTEL_TRACES_SAMPLER_ARG's)
SAMPLERS = {"always_on": (False, 1.0), "always_off": (False, 0.0), "traceidratio": (False, None),
            "parentbased_always_on": (True, 1.0), "parentbased_always_off": (True, 0.0),
            "parentbased_traceidratio": (True, None)}


def resolve(telemetry: Any, env: Mapping[str, str] | None = None) -> TraceSettings | None:
    """The trace settings for a config's `telemetry` section, or None when tracing is off: `traces: false`,
    OTEL_SDK_DISABLED=true, or `traces` null and no OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT set (OTEL_TRACES_EXPORTER
    `none` also turns the environment's endpoint off). A value in the file wins over the environment's; the
    sampler is parent-based at the file's `sample_ratio`, else OTEL_TRACES_SAMPLER's (default: every trace)."""
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
    if telemetry.sample_ratio is not None:
        sampler = (True, float(telemetry.sample_ratio))
    else:
        sampler = _sampler(env)
    return TraceSettings(endpoint=endpoint, sampler=sampler,
                         service_name=telemetry.service_name or env.get("OTEL_SERVICE_NAME") or "tokenomy",
                         capture_content=telemetry.capture_content, timeout_s=telemetry.timeout_s)


def _sampler(env: Mapping[str, str]) -> tuple[bool, float]:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in SAMPLERS:
        log.warning("OTEL_TRACES_SAMPLER=%s is not one tokenomy knows (%s): every trace is kept", name,
                    ", ".join(SAMPLERS))
        return True, 1.0
    parent_based, ratio = SAMPLERS[name]
    if ratio is None:
        try:
            ratio = min(max(float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")), 0.0), 1.0)
        except ValueError:
            log.warning("OTEL_TRACES_SAMPLER_ARG is not a number: every trace is kept")
            ratio = 1.0
    return parent_based, ratio


# ---- the tracer ---------------------------------------------------------------------------------------------------

class Tracer:
    """One gateway's tracer: whether a new trace is kept (`sampler`), the OTLP exporter behind the SDK's
    BatchSpanProcessor (its own, never the process-global provider, so two gateways in one process trace apart),
    the model -> provider names, and whose content may be recorded (`content(tenant)`: the ledger's store_prompts
    rule; only with `capture_content`)."""

    def __init__(self, settings: TraceSettings, providers: Mapping[str, str],
                 content: Callable[[str], bool] | None = None, exporter: Any = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from tokenomy import __version__

        self.settings = settings
        self.providers = dict(providers)
        self.content = content if settings.capture_content else None
        self.parent_based, ratio = settings.sampler
        self.bound = round(min(max(ratio, 0.0), 1.0) * 2 ** 64)     # TraceIdRatioBased's: the id's low 64 bits
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.timeout_s)
        self._reads = (_request_reads, self)
        self.processor = BatchSpanProcessor(_Export(exporter, Resource.create({"service.name": settings.service_name}),
                                                    InstrumentationScope("tokenomy", __version__)))
        log.info("traces go to %s as service %s", settings.endpoint, settings.service_name)

    def start(self, ctx: Any) -> None:
        """Start the request's trace, continuing the caller's traceparent (and its sampled flag, parent-based) if
        it sent a valid one: sets `ctx.trace` and `ctx.trace_id`. The request's span starts at its arrival."""
        header = ctx.headers.get("traceparent")
        caller = _parse(header) if header else None
        if caller is not None:
            trace_id, parent, flags = caller
            remote: int | None = int(parent, 16)
            sampled = bool(flags & 1) if self.parent_based else int(trace_id[16:], 16) < self.bound
        else:
            bits = random.getrandbits(128) or 1
            trace_id, remote, sampled = f"{bits:032x}", None, bits & 0xFFFFFFFFFFFFFFFF < self.bound
        t = RequestTrace(self, trace_id, sampled, ctx.headers.get("tracestate") if caller is not None else None,
                         remote)
        kind = "internal" if getattr(ctx, "batch_id", None) else "server"
        t.root = Span(t, f"{OPERATIONS.get(ctx.gen.kind, ctx.gen.kind)} {ctx.gen.model}".rstrip(), kind, None,
                      ctx.started, self._reads, {})
        ctx.trace, ctx.trace_id = t, trace_id

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every finished trace now; False when that did not finish within `timeout_s`."""
        return self.processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.processor.shutdown()


class Span:
    """One span as the request path records it: its name, kind, parent span (None: the request's, whose parent is
    the caller's), perf_counter times, and what it says. Nothing is read or encoded here: `reads` is a function and
    its arguments, `(f, *args)`, that the export thread calls as `f(ctx, *args)` with the finished request's
    context for the span's attributes (the request's, a stage's, an upstream call's), and `attributes` holds those
    set directly (error.type). Its id is drawn when a `traceparent` needs it (an upstream call's) or on export. A
    span that never ended when its trace is exported ends with the request."""

    __slots__ = ("trace", "name", "kind", "parent", "start", "end", "attributes", "reads", "error", "span_id")

    def __init__(self, trace: RequestTrace, name: str, kind: str, parent: Span | None, start: float,
                 reads: tuple[Any, ...] | None = None, attributes: dict[str, Any] | None = None) -> None:
        self.trace, self.name, self.kind, self.parent, self.start, self.reads = trace, name, kind, parent, start, reads
        self.end: float | None = None
        self.attributes = attributes           # None: none set directly (most spans)
        self.error: str | None = None          # the status message of a span that failed (error.type says why)
        self.span_id = 0                       # 0: not drawn yet
        if trace.sampled:
            trace.spans.append(self)

    @property
    def sampled(self) -> bool:
        return self.trace.sampled

    def child(self, name: str, kind: str = "internal", start: float | None = None,
              attributes: dict[str, Any] | None = None, reads: tuple[Any, ...] | None = None) -> Span:
        return Span(self.trace, name, kind, self, time.perf_counter() if start is None else start, reads, attributes)

    def finish(self, end: float | None = None) -> None:
        self.end = time.perf_counter() if end is None else end

    def fail(self, error_type: str, message: str) -> None:
        if self.attributes is None:
            self.attributes = {}
        self.attributes["error.type"] = error_type
        self.error = message[:200] or error_type

    def traceparent(self) -> dict[str, str]:
        """The headers that continue the trace under this span (W3C trace context; the caller's tracestate on)."""
        t = self.trace
        if not self.span_id:
            self.span_id = random.getrandbits(64) or 1
        headers = {"traceparent": f"00-{t.trace_id}-{self.span_id:016x}-{'01' if t.sampled else '00'}"}
        if t.tracestate:
            headers["tracestate"] = t.tracestate
        return headers


class _Sampled:
    """What the BatchSpanProcessor reads of an item before it queues it (`item.context.trace_flags.sampled`)."""

    class trace_flags:   # noqa: N801 (the SDK's attribute name)
        sampled = True


class RequestTrace:
    """One request's trace: its id, the caller's span id and tracestate, whether it is kept, its spans (none when
    it is not: it still propagates), the stage at work (`at_work`: entered, not yet handed on) and those still at
    work after handing on (a stage that hands on a stream works until the stream ends), the finished request's
    context (`ctx`, from `finish` until the export reads it), and the clock that turns perf_counter times into UNIX
    nanoseconds."""

    __slots__ = ("tracer", "trace_id", "sampled", "tracestate", "remote", "root", "spans", "at_work", "open",
                 "anchor_ns", "anchor", "ctx", "content")
    context = _Sampled()

    def __init__(self, tracer: Tracer, trace_id: str, sampled: bool, tracestate: str | None,
                 remote: int | None = None) -> None:
        self.tracer, self.trace_id, self.sampled, self.tracestate = tracer, trace_id, sampled, tracestate
        self.remote = remote                   # the caller's span id: the request span's parent
        self.spans: list[Span] = []
        self.at_work: Span | None = None
        self.open: list[Span] = []
        self.anchor_ns, self.anchor = time.time_ns(), time.perf_counter()
        self.ctx: Any = None
        self.content = False                   # whether the request's content goes on its span
        self.root: Span

    def ns(self, t: float) -> int:
        return self.anchor_ns + int((t - self.anchor) * 1e9)

    def enter(self, name: str, ctx: Any) -> Span | None:
        """A pipeline stage starts (the one at work before it has handed on: `handed`): its span, None when the
        trace is not kept, is the parent its backends see for their spans (`GenRequest.trace`). The span ends when
        the stage hands on, or returns or raises (`left`), or when the request ends if the stage leaves an answer
        streaming. What it says is read from the finished request (`stage_attributes`)."""
        if not self.sampled:           # no spans, but upstreams still learn the trace
            ctx.gen.trace = self.root
            return None
        now = time.perf_counter()
        before = self.at_work
        if before is not None:         # handed on (`handed`)
            if ctx.deltas is not None:
                self.open.append(before)
            else:
                before.end = now
        reads = _STAGES.get(name)
        if reads is None:
            reads = _STAGES[name] = (_stage_reads, name)
        span = self.at_work = Span(self, name, "internal", self.root, now, reads)
        ctx.gen.trace = span
        return span

    def left(self, span: Span | None, ctx: Any, error: BaseException | None = None) -> None:
        """The stage of `span` (`enter`'s) returned, or raised `error`: its span ends if it never handed on."""
        if span is not None and self.at_work is span:
            if error is not None:
                _failed(span, error)
            self.handed(ctx)

    def handed(self, ctx: Any) -> None:
        """The stage at work, if any, handed the request on (or returned): its span ends unless its answer is still
        streaming. The chain calls this too before a stage that has no span."""
        span = self.at_work
        if span is None:
            return
        self.at_work = None
        if ctx.deltas is not None:     # its answer is still streaming: at work until the stream ends
            self.open.append(span)
        else:
            span.end = time.perf_counter()

    def finish(self, ctx: Any, record_started: float) -> None:
        """End the request's trace: the stages still at work, the record stage's span (from `record_started`, a
        perf_counter time) and the request's span; then hand it, with the finished request's context, to the
        exporter, whose thread reads the spans' attributes from it."""
        if not self.sampled:
            return
        end = time.perf_counter()
        span = self.at_work
        if span is not None:
            self.at_work = None
            span.end = end
        for span in self.open:
            span.end = end
        self.open = []
        Span(self, "record", "internal", self.root, record_started).end = end
        self.root.end = end
        content = self.tracer.content
        self.content = content is not None and content(ctx.tenant)
        self.ctx = _kept(ctx, self.content)
        self.tracer.processor.on_end(self)


# ---- what the spans say, read on the export thread ----------------------------------------------------------------

def _kept(ctx: Any, content: bool) -> Any:
    """What the export thread reads of a finished request: a shallow copy of its context (two dict copies, no
    attribute read) without what can be large and is never read there (an embeddings answer's vectors, the texts'
    vectors, the answer stream) and, unless its content goes on the span, without the prompt (messages, prompt,
    inputs, tools), so that a full queue of traces (a collector that is down) holds little."""
    kept = object.__new__(type(ctx))
    kept.__dict__.update(ctx.__dict__)
    kept.embeddings = kept.vectors = kept.deltas = kept.cover = kept.token_router = kept.lint = None
    if not content:
        kept.gen = _slim(ctx.gen)
    return kept


def _slim(gen: GenRequest) -> GenRequest:
    """A shallow copy of a request without its prompt (what its spans' attributes never read)."""
    slim = object.__new__(type(gen))
    slim.__dict__.update(gen.__dict__)
    slim.messages = slim.prompt = slim.inputs = slim.tools = slim.counted = slim.trace = None
    return slim


def _request_reads(ctx: Any, tracer: Tracer) -> dict[str, Any]:
    """The request span's attributes (its error.type when it failed: `_Export` makes its status from it)."""
    attrs = request_attributes(ctx.gen, tracer.providers.get(ctx.model or "", "tokenomy"), stream=ctx.stream)
    attrs.update(answer_attributes(ctx))
    if ctx.trace is not None and ctx.trace.content:
        attrs.update(content_attributes(ctx))
    error = error_type(ctx)
    if error is not None:
        attrs["error.type"] = error
    return attrs


def _stage_reads(ctx: Any, name: str) -> dict[str, Any]:
    return stage_attributes(name, ctx)


_STAGES: dict[str, tuple[Any, str]] = {}       # a stage's `reads`, by its name (one tuple a stage, not a span)


def _call_reads(ctx: Any, req: GenRequest, operation: str, model: str, provider: str, url: str,
                usage: Usage | None) -> dict[str, Any]:
    attrs = request_attributes(req, provider, model=model, operation=operation)
    attrs.update(_server(url))
    if usage is not None:
        attrs.update(usage_attributes(usage))
    return attrs


def _inference_reads(ctx: Any, req: GenRequest, operation: str, model: str, usage: Usage) -> dict[str, Any]:
    attrs = request_attributes(req, "tokenomy", model=model, operation=operation)
    attrs.update(usage_attributes(usage))
    attrs["gen_ai.response.model"] = model
    return attrs


def _prefill_reads(ctx: Any, usage: Usage) -> dict[str, Any]:
    return {"gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            "tokenomy.engine.prefilled_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0)}


def _decode_reads(ctx: Any, usage: Usage) -> dict[str, Any]:
    attrs: dict[str, Any] = {"gen_ai.usage.output_tokens": usage.completion_tokens}
    if usage.draft_tokens:
        attrs["tokenomy.engine.draft_tokens"] = usage.draft_tokens
        attrs["tokenomy.engine.draft_accepted"] = usage.draft_accepted or 0
    return attrs


@dataclass
class _Read:
    """A span as it is exported: its ids, times (UNIX ns), attributes (None values left in) and status message."""

    span: Span
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None


def _read(t: RequestTrace) -> list[_Read]:
    """The spans of a finished trace as they are exported: ids drawn where none was, each span's attributes read
    from the request's context, a span that never ended ending with the request."""
    spans, ctx = list(t.spans), t.ctx       # a copy: a span of a stream that ends late may still be added
    ends = t.root.end if t.root.end is not None else time.perf_counter()
    out = []
    for s in spans:
        if not s.span_id:
            s.span_id = random.getrandbits(64) or 1
        attrs = {}
        if s.reads is not None and ctx is not None:
            try:
                attrs = s.reads[0](ctx, *s.reads[1:])
            except Exception:        # one span that cannot be read loses its attributes, not its trace
                log.exception("a span's attributes could not be read")
        if s.attributes:
            attrs.update(s.attributes)
        error = s.error
        if s is t.root and error is None and "error.type" in attrs:
            failed = ctx.error if ctx is not None else None
            error = (failed.message[:200] if failed is not None else "") or attrs["error.type"]
        parent = s.parent.span_id if s.parent is not None else t.remote
        out.append(_Read(s, s.span_id, parent, t.ns(s.start), t.ns(s.end if s.end is not None else ends), attrs,
                         error))
    return out


class _Export:
    """The exporter the batch processor's thread calls with finished request traces. With the SDK's OTLP/HTTP
    exporter (its `_client`: the HTTP client that sends, with its retries, compression, headers and TLS as the
    OTEL_EXPORTER_OTLP_* variables set them) the spans are written as OTLP by meter/otlp.py and sent by that
    client in one request; any other exporter (an older SDK's, a test's in-memory one) gets the SDK's
    ReadableSpans, which cost ten times as much to make and encode."""

    def __init__(self, exporter: Any, resource: Any, scope: Any) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

        self.exporter, self.resource, self.scope = exporter, resource, scope
        self._result = SpanExportResult
        try:
            from opentelemetry.exporter.otlp.common.http import _OTLPHTTPClient
        except ImportError:
            _OTLPHTTPClient = None    # noqa: N806 (the SDK's class name)
        client = getattr(exporter, "_client", None)
        self._send = client.export if _OTLPHTTPClient is not None and isinstance(client, _OTLPHTTPClient) else None
        self._encoder = otlp.Encoder(resource.attributes, scope.name, scope.version)
        self._readable, self._context, self._state = ReadableSpan, SpanContext, TraceState
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
        self._flags = TraceFlags(TraceFlags.SAMPLED)
        self._ok, self._error = Status(StatusCode.UNSET), StatusCode.ERROR
        self._status = Status

    def export(self, traces: Sequence[RequestTrace]) -> Any:
        encode = self._encoded if self._send is not None else self._spans
        spans: list[Any] = []
        for t in traces:
            try:
                spans += encode(t)
            except Exception:            # one trace that cannot be read is dropped, not the batch
                log.exception("a request's trace could not be exported")
            t.spans, t.ctx = [], None    # exported: no cycle (span -> trace -> spans, context) keeps them alive
        if self._send is None:
            return self.exporter.export(spans)
        if getattr(self.exporter, "_shutdown", False):
            return self._result.FAILURE
        return self._result.SUCCESS if self._send(self._encoder.request(spans)).success else self._result.FAILURE

    def _encoded(self, t: RequestTrace) -> list[bytes]:
        tid, state = bytes.fromhex(t.trace_id), otlp.Encoder.trace_state(t.tracestate)
        span, root = self._encoder.span, t.root
        return [span(r.span.name, r.span.kind, r.span_id, r.parent_id, tid, state, r.start_ns, r.end_ns, r.attributes,
                     r.error, r.span is root) for r in _read(t)]

    def _spans(self, t: RequestTrace) -> list[Any]:
        tid = int(t.trace_id, 16)
        state = self._state.from_header([t.tracestate]) if t.tracestate else None
        out = []
        for r in _read(t):
            attributes = {k: v for k, v in r.attributes.items() if v is not None}
            context = self._context(tid, r.span_id, False, self._flags, state)
            remote = r.span is t.root
            parent = (self._context(tid, r.parent_id, remote, self._flags, state)
                      if r.parent_id is not None else None)
            out.append(self._readable(
                r.span.name, context=context, parent=parent, resource=self.resource, kind=self._kinds[r.span.kind],
                attributes=attributes, status=self._ok if r.error is None else self._status(self._error, r.error),
                start_time=r.start_ns, end_time=r.end_ns, instrumentation_scope=self.scope))
        return out

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


# ---- backends: upstream calls and the engine ----------------------------------------------------------------

class Call:
    """One upstream call's CLIENT span; `headers` carry its traceparent to the upstream. Its attributes are read on
    export, from the call's request and its usage."""

    __slots__ = ("span", "headers", "finishes", "usage", "_reads")

    def __init__(self, parent: Span, operation: str, model: str, provider: str, url: str, req: GenRequest) -> None:
        self._reads = (_call_reads, _slim(req), operation, model, provider, url)
        self.span = parent.child(f"{operation} {model}", kind="client", reads=self._reads + (None,))
        self.headers = self.span.traceparent()
        self.finishes: list[str] = []
        self.usage: Usage | None = None

    def end(self, error: BaseException | None = None) -> None:
        span = self.span
        if self.usage is not None:
            span.reads = self._reads + (self.usage,)
        if self.finishes:
            span.attributes = {**(span.attributes or {}), "gen_ai.response.finish_reasons": self.finishes}
        if error is not None:
            _failed(span, error)
        span.end = time.perf_counter()


@functools.lru_cache(maxsize=256)
def _server(url: str) -> tuple[tuple[str, Any], ...]:
    """server.address and server.port of an upstream's URL (none without a host)."""
    where = urlsplit(url)
    if not where.hostname:
        return ()
    return ("server.address", where.hostname), ("server.port", where.port or (443 if where.scheme == "https" else 80))


def client_stream(parent: Span | None, make: Callable[[dict[str, str] | None], AsyncIterator[Delta]],
                  req: GenRequest, provider: str, model: str, url: str) -> AsyncIterator[Delta]:
    """An upstream's answer stream, `make(headers)`, inside a CLIENT span when `parent` is set (else `make(None)`
    itself): `headers` (the traceparent) go on every HTTP request of the call, retries included."""
    if parent is None:
        return make(None)
    if not parent.trace.sampled:
        return make(parent.traceparent())
    try:
        call = Call(parent, OPERATIONS.get(req.kind, req.kind), model, provider, url, req)
    except Exception:                 # tracing never fails a request
        log.exception("tracing an upstream call failed")
        return make(None)
    return _traced_stream(call, make)


async def _traced_stream(call: Call, make: Callable[[dict[str, str] | None], AsyncIterator[Delta]]
                         ) -> AsyncIterator[Delta]:
    inner = make(call.headers)
    try:
        async for d in inner:
            if d.finish_reason is not None:
                call.finishes.append(d.finish_reason)
            if d.usage is not None:
                call.usage = d.usage
            yield d
    except BaseException as e:
        call.end(e)
        raise
    finally:
        await inner.aclose()
    call.end()


async def client_call(parent: Span | None, make: Callable[[dict[str, str] | None], Awaitable[Any]],
                      req: GenRequest, provider: str, model: str, url: str) -> Any:
    """`client_stream` for a call with one answer (an embeddings request): `await make(headers)`; its `usage`, if
    it has one, is recorded."""
    if parent is None or not parent.trace.sampled:
        return await make(None if parent is None else parent.traceparent())
    try:
        call = Call(parent, OPERATIONS.get(req.kind, req.kind), model, provider, url, req)
    except Exception:                 # tracing never fails a request
        log.exception("tracing an upstream call failed")
        return await make(None)
    try:
        out = await make(call.headers)
    except BaseException as e:
        call.end(e)
        raise
    call.usage = getattr(out, "usage", None)
    call.end()
    return out


def engine(parent: Span | None, req: GenRequest, model: str, started: float, arrival: float,
           usage: Usage) -> None:
    """The embedded engine's answer as spans, made after the fact from its timings: the inference (INTERNAL, from
    `started`, when the backend took the request, to now) and inside it the queue wait (from `arrival` at the
    engine to its first step), the prefill (to the first token) and the decode (to the end). Times are
    perf_counter seconds; the usage's queue_s and ttft_s count from `arrival`."""
    if parent is None or not parent.trace.sampled:
        return
    try:
        _engine(parent, req, model, started, arrival, usage)
    except Exception:                 # tracing never fails a request
        log.exception("tracing the engine's answer failed")


def _engine(parent: Span, req: GenRequest, model: str, started: float, arrival: float, usage: Usage) -> None:
    end = time.perf_counter()
    operation = OPERATIONS.get(req.kind, req.kind)
    inference = parent.child(f"{operation} {model}", start=started,
                             reads=(_inference_reads, _slim(req), operation, model, usage))
    scheduled = min(arrival + max(usage.queue_s, 0.0), end)
    first = min(max(arrival + usage.ttft_s, scheduled), end) if usage.ttft_s is not None else end
    inference.child("queue", start=arrival).end = scheduled
    inference.child("prefill", start=scheduled, reads=(_prefill_reads, usage)).end = first
    if usage.ttft_s is not None:
        inference.child("decode", start=first, reads=(_decode_reads, usage)).end = end
    inference.end = end


def _failed(span: Span, e: BaseException) -> None:
    if isinstance(e, GeneratorExit) or type(e).__name__ == "CancelledError":
        kind = "cancelled"
    else:       # an APIError's code (rate_limit_exceeded, model_not_found ...), else the exception's class
        kind = getattr(e, "code", None) or type(e).__name__
    span.fail(str(kind), str(e))


def _parse(traceparent: str) -> tuple[str, str, int] | None:
    """(trace id, parent span id, flags) of a valid W3C traceparent header, else None."""
    m = _TRACEPARENT.match(traceparent.strip().lower())
    if m is None or m.group(1) == "ff" or m.group(2) == "0" * 32 or m.group(3) == "0" * 16:
        return None
    return m.group(2), m.group(3), int(m.group(4), 16)


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
environment variables; OTEL_SDK_DISABLED=true turns it off. Spans are exported by a process of their own
(telemetry/trace_export.py) through the SDK's BatchSpanProcessor and OTLP/HTTP exporter: a collector that is down, or
an exporter process that died, loses spans, never a request.

The request path only records: a span is its name, kind, parent span, perf_counter times and what it says, as plain
values (`Span.reads`: what its attributes are read from, a stage's name, an upstream call's request and usage ...).
When the request ends its trace is queued with the finished request's facts as plain values
(trace_export.plain_context); a sender thread hands the queue to the exporter process as one marshal string every
0.2 s, and the exporter process draws the span ids (an upstream call's is drawn on the request path, for its
`traceparent`), reads the attributes (telemetry/span_attributes.py) and hands them to the SDK's BatchSpanProcessor and
OTLP/HTTP exporter as ReadableSpans. The request path uses no SDK span object, and none of the export runs under
the gateway's interpreter lock: a traced request has eight spans or more and the issue allows it 0.2 ms
(docs/telemetry.md, "How spans are built" and "What it costs").

The stages do not call this module: the pipeline's chain tells the request's trace when each stage starts and
returns (`RequestTrace.enter` / `left`; a stage's span ends when the next one starts, `handed`), the record stage
starts and finishes the request's trace, and a backend hands its calls to `client_stream` / `client_call` and the
engine's timings to `engine`, with the parent it finds in `GenRequest.trace` (None: not traced).
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.telemetry import trace_export
from tokenomy.telemetry.span_attributes import OPERATIONS
from tokenomy.telemetry.trace_export import plain_context, plain_request, plain_usage

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
    """One gateway's tracer: whether a new trace is kept (`sampler`), where finished traces go (`sink`: its own
    exporter process, trace_export.ExportProcess, never the process-global provider, so two gateways in one
    process, or the API workers of one server, export apart; a given `exporter` object runs in this process
    instead), the model -> provider names, and whose content may be recorded (`content(tenant)`: the ledger's
    store_prompts rule; only with `capture_content`)."""

    def __init__(self, settings: TraceSettings, providers: Mapping[str, str],
                 content: Callable[[str], bool] | None = None, exporter: Any = None) -> None:
        from tokenomy import __version__

        self.settings = settings
        self.providers = dict(providers)
        self.content = content if settings.capture_content else None
        self.parent_based, ratio = settings.sampler
        self.bound = round(min(max(ratio, 0.0), 1.0) * 2 ** 64)     # TraceIdRatioBased's: the id's low 64 bits
        self._reads = ("r",)
        self.sink: trace_export.ExportProcess | trace_export.InProcess
        if exporter is not None:
            self.sink = trace_export.InProcess(exporter, settings.service_name, __version__)
        else:
            try:
                self.sink = trace_export.ExportProcess(settings.endpoint, settings.timeout_s, settings.service_name,
                                                       __version__)
            except OSError as e:       # no process to be had: export on a thread of this one
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                log.warning("the trace exporter process could not start (%s): exporting from the gateway's", e)
                self.sink = trace_export.InProcess(
                    OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.timeout_s), settings.service_name,
                    __version__)
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

    @property
    def dropped(self) -> int:
        """Finished traces dropped before export: the queue to the exporter was full, or the exporter is gone."""
        return self.sink.dropped

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every finished trace now; False when that did not finish within `timeout_s`."""
        return self.sink.flush(timeout_s)

    def shutdown(self) -> None:
        self.sink.shutdown()


class Span:
    """One span as the request path records it: its name, kind, parent span (None: the request's, whose parent is
    the caller's), perf_counter times, and what it says. Nothing is read or encoded here: `reads` is a tuple of
    plain values saying what the exporter reads its attributes from (trace_export's plain form: ("r",) the
    finished request, ("s", stage), ("c", request, ...) an upstream call ...), and `attributes` holds those set
    directly (error.type). Its id is drawn when a `traceparent` needs it (an upstream call's) or on export. A
    span that has not ended when its request does ends with the request."""

    __slots__ = ("trace", "name", "kind", "parent", "start", "end", "attributes", "reads", "error", "span_id",
                 "index")

    def __init__(self, trace: RequestTrace, name: str, kind: str, parent: Span | None, start: float,
                 reads: tuple[Any, ...] | None = None, attributes: dict[str, Any] | None = None) -> None:
        self.trace, self.name, self.kind, self.parent, self.start, self.reads = trace, name, kind, parent, start, reads
        self.end: float | None = None
        self.attributes = attributes           # None: none set directly (most spans)
        self.error: str | None = None          # the status message of a span that failed (error.type says why)
        self.span_id = 0                       # 0: not drawn yet
        if trace.sampled:
            self.index = len(trace.spans)      # its place in the trace: its children's parent in the plain form
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


class RequestTrace:
    """One request's trace: its id, the caller's span id and tracestate, whether it is kept, its spans (none when
    it is not: it still propagates), the stage at work (`at_work`: entered, not yet handed on) and those still at
    work after handing on (a stage that hands on a stream works until the stream ends), and the clock (`anchor_ns`,
    `anchor`) by which the exporter turns perf_counter times into UNIX nanoseconds. Once finished it holds no
    span (`root` None, `spans` empty)."""

    __slots__ = ("tracer", "trace_id", "sampled", "tracestate", "remote", "root", "spans", "at_work", "open",
                 "anchor_ns", "anchor", "content")

    def __init__(self, tracer: Tracer, trace_id: str, sampled: bool, tracestate: str | None,
                 remote: int | None = None) -> None:
        self.tracer, self.trace_id, self.sampled, self.tracestate = tracer, trace_id, sampled, tracestate
        self.remote = remote                   # the caller's span id: the request span's parent
        self.spans: list[Span] = []
        self.at_work: Span | None = None
        self.open: list[Span] = []
        self.anchor_ns, self.anchor = time.time_ns(), time.perf_counter()
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
            reads = _STAGES[name] = ("s", name)
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
        perf_counter time) and the request's span; then queue it, with the finished request's facts as plain values
        (trace_export.plain_context), for the exporter process, which reads the spans' attributes from them. The
        trace lets go of its spans."""
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
        tracer = self.tracer
        content = tracer.content
        self.content = content is not None and content(ctx.tenant)
        spans, self.spans = self.spans, []
        self.root = None     # type: ignore[assignment]   (no cycle left: refcounting frees the spans)
        tracer.sink.put((self.trace_id, self.tracestate, self.remote, self.anchor_ns, self.anchor, end, self.content,
                         plain_context(ctx, tracer.providers.get(ctx.model or "", "tokenomy"), self.content), spans))


_STAGES: dict[str, tuple[str, str]] = {}       # a stage's `reads`, by its name (one tuple a stage, not a span)


# ---- backends: upstream calls and the engine ----------------------------------------------------------------

class Call:
    """One upstream call's CLIENT span; `headers` carry its traceparent to the upstream. Its attributes are read on
    export, from the call's request and its usage (their plain forms)."""

    __slots__ = ("span", "headers", "finishes", "usage", "_reads")

    def __init__(self, parent: Span, operation: str, model: str, provider: str, url: str, req: GenRequest) -> None:
        self._reads = ("c", plain_request(req), operation, model, provider, url)
        self.span = parent.child(f"{operation} {model}", kind="client", reads=self._reads + (None,))
        self.headers = self.span.traceparent()
        self.finishes: list[str] = []
        self.usage: Usage | None = None

    def end(self, error: BaseException | None = None) -> None:
        span = self.span
        if self.usage is not None:
            span.reads = self._reads + (plain_usage(self.usage),)
        if self.finishes:
            span.attributes = {**(span.attributes or {}), "gen_ai.response.finish_reasons": self.finishes}
        if error is not None:
            _failed(span, error)
        span.end = time.perf_counter()


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
    u = plain_usage(usage)
    inference = parent.child(f"{operation} {model}", start=started,
                             reads=("i", plain_request(req), operation, model, u))
    scheduled = min(arrival + max(usage.queue_s, 0.0), end)
    first = min(max(arrival + usage.ttft_s, scheduled), end) if usage.ttft_s is not None else end
    inference.child("queue", start=arrival).end = scheduled
    inference.child("prefill", start=scheduled, reads=("p", u)).end = first
    if usage.ttft_s is not None:
        inference.child("decode", start=first, reads=("d", u)).end = end
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


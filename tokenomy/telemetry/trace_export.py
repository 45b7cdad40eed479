"""Exporting the gateway's traces (telemetry/trace.py) from a process of their own: the exporter process.

The gateway's request path records each span as a few plain values and, when the request ends, queues the trace
with the finished request's facts that its attributes are read from (`plain_context`: a tuple, some 1.5 us).
That is all it does per trace: a sender thread takes what is queued every `SEND_EVERY_S` (or at 64 traces),
writes it as one `marshal` string (`dumps`: each span a tuple, `plain_trace`) and hands it to the exporter process
over a socket (one write, the interpreter lock released while it waits). The exporter process, a fresh interpreter
the tracer starts (`ExportProcess`; one per gateway, so one per API worker with server.workers > 1), does the
rest: it draws the span ids not drawn yet, reads each span's attributes (telemetry/span_attributes.py, on the
request's facts rebuilt as the objects it reads), makes them the SDK's ReadableSpans (`Spans`) and hands them to
the SDK's BatchSpanProcessor (OTEL_BSP_* as before) in front of the SDK's OTLP/HTTP exporter, which encodes and
posts them: the SDK's public interfaces only. None of that holds the gateway's interpreter lock: on the shared
lock an export thread cost the event loop some 0.1 ms a request (docs/telemetry.md, "What it costs").

Bounds and failure: the gateway's queue holds OTEL_BSP_MAX_QUEUE_SIZE traces (2048) and drops (and counts) beyond
that, never blocking the request path; the exporter's BatchSpanProcessor queue holds as many spans; a collector
that is down or an exporter process that died loses spans, never a request. The exporter exits when its end of
the socket closes: at the tracer's shutdown after exporting what was queued (the gateway sends its queue first),
and when the gateway dies, even by SIGKILL (the kernel closes the gateway's end; the exporter also watches its
parent's pid), so it is never orphaned. A given exporter object (a test's in-memory one) runs in the gateway's
process instead (`InProcess`), on the same path from the same plain form.
"""

from __future__ import annotations

import functools
import json
import logging
import marshal
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from tokenomy.generation import GenRequest, Usage
from tokenomy.telemetry.span_attributes import (
    answer_attributes,
    content_attributes,
    error_type,
    request_attributes,
    stage_attributes,
    usage_attributes,
)

log = logging.getLogger("tokenomy.trace")

ENTRY = "import sys; from tokenomy.telemetry.trace_export import main; main(int(sys.argv[1]), sys.argv[2])"
SEND_EVERY_S = 0.2          # how long a finished trace waits in the gateway at most before it goes to the exporter
SEND_BATCH = 64             # ... or once this many are queued: one batch's marshal holds the lock well under 1 ms


# ---- the plain form: made on the request path (the request's facts) and the sender's thread (the spans) ----------
#
# A trace: (trace id hex, tracestate, the caller's span id or None, anchor ns, anchor perf_counter, the request
#   span's end, whether its content goes on the span, the request's facts (`plain_context`), spans)
# A span: (name, kind, span id or 0 (not drawn), parent's index in the spans or -1 (the caller's), start, end or None
#   (ends with the request), reads, attributes set directly or None, status message or None)
# `reads` says what the span's attributes are read from: ("r",) the request; ("s", stage); ("c", request, operation,
#   model, provider, url, usage) an upstream call; ("i", request, operation, model, usage) the engine's answer;
#   ("p", usage) its prefill; ("d", usage) its decode; None: nothing.

# the request parameters span_attributes.request_attributes reads
_PARAMS = ("max_tokens", "temperature", "top_p", "seed", "top_k", "frequency_penalty", "presence_penalty", "n", "stop")


def plain_request(gen: GenRequest, content: bool = False) -> tuple[Any, ...]:
    """What a span reads of a request: kind, model, stream, api, the parameters it reads, and with its content the
    messages and prompt."""
    p = gen.params
    return (gen.kind, gen.model, gen.stream, gen.api, {k: p[k] for k in _PARAMS if k in p},
            gen.messages if content else None, gen.prompt if content else None)


def plain_usage(u: Usage) -> tuple[Any, ...]:
    return u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.cache_write_tokens, u.draft_tokens, \
        u.draft_accepted


def plain_context(ctx: Any, provider: str, content: bool) -> tuple[Any, ...]:
    """What the request's and its stages' spans read of the finished request (pipeline/request.py's
    RequestContext, read by its fields)."""
    err, result, usage, work, saving, d = (ctx.error, ctx.result, ctx.usage, ctx.context_work, ctx.cache_saving,
                                           ctx.route_decision)
    return (provider, ctx.request_id, ctx.tenant, ctx.key_id, ctx.cache, ctx.cache_bypass, ctx.status, ctx.route,
            ctx.model, ctx.finish_reason, ctx.cost_usd, bool(ctx.over_budget), ctx.prompt_tokens, ctx.stream_error,
            ctx.stream, plain_request(ctx.gen, content),
            None if err is None else (err.code, err.status, err.message),
            None if result is None else [(c.finish_reason, c.text, c.tool_calls) if content else (c.finish_reason,)
                                         for c in result.all_choices],
            None if usage is None else plain_usage(usage),
            None if work is None else (work.before, work.after, list(work.actions)),
            None if saving is None else (saving.tokens, saving.similarity),
            None if d is None else (d.chosen, d.by, list(d.candidates), d.route),
            [(a.get("model"), a.get("outcome")) for a in ctx.attempts],
            ctx.text if content else "")


def plain_trace(finished: tuple[Any, ...]) -> tuple[Any, ...]:
    """A finished trace as the request path queues it (telemetry/trace.py's RequestTrace.finish: the trace's fields,
    `plain_context`'s tuple and its Span objects) in its plain form: each span a tuple. On the sender's thread:
    a span's fields are final by then (one of a stream that ends late may still take its end)."""
    spans = [(s.name, s.kind, s.span_id, -1 if s.parent is None else s.parent.index, s.start, s.end, s.reads,
              s.attributes, s.error) for s in finished[8]]
    return (*finished[:8], spans)


def dumps(finished: Sequence[tuple[Any, ...]]) -> tuple[bytes, int]:
    """(one marshal string of these finished traces' plain forms, how many were left out: something on them
    was not a plain value)."""
    plain = [plain_trace(t) for t in finished]
    try:
        return marshal.dumps(plain), 0
    except ValueError:
        kept = []
        for t in plain:
            try:
                marshal.dumps(t)
            except ValueError:
                log.warning("a request's trace is left out: something on it is not a plain value", exc_info=True)
                continue
            kept.append(t)
        return marshal.dumps(kept), len(plain) - len(kept)


# ---- read back: in the exporter ------------------------------------------------------------------------------------

def _request(p: Sequence[Any]) -> Any:
    kind, model, stream, api, params, messages, prompt = p
    return SimpleNamespace(kind=kind, model=model, stream=stream, api=api, params=params, messages=messages,
                           prompt=prompt)


def _usage(p: Sequence[Any] | None) -> Usage | None:
    if p is None:
        return None
    return Usage(prompt_tokens=p[0], completion_tokens=p[1], cached_tokens=p[2], cache_write_tokens=p[3],
                 draft_tokens=p[4], draft_accepted=p[5])


def _context(p: Sequence[Any]) -> tuple[str, Any]:
    """(provider, the finished request as span_attributes reads it) of `plain_context`'s tuple."""
    (provider, request_id, tenant, key_id, cache, cache_bypass, status, route, model, finish_reason, cost_usd,
     over_budget, prompt_tokens, stream_error, stream, gen, err, choices, usage, work, saving, decision, attempts,
     text) = p
    ns = SimpleNamespace
    return provider, ns(
        request_id=request_id, tenant=tenant, key_id=key_id, cache=cache, cache_bypass=cache_bypass, status=status,
        route=route, model=model, finish_reason=finish_reason, cost_usd=cost_usd, over_budget=over_budget,
        prompt_tokens=prompt_tokens, stream_error=stream_error, stream=stream, gen=_request(gen),
        error=None if err is None else ns(code=err[0], status=err[1], message=err[2]),
        result=None if choices is None else ns(all_choices=[
            ns(finish_reason=c[0], text=c[1] if len(c) > 1 else "", tool_calls=c[2] if len(c) > 2 else None)
            for c in choices]),
        usage=_usage(usage),
        context_work=None if work is None else ns(before=work[0], after=work[1], actions=work[2]),
        cache_saving=None if saving is None else ns(tokens=saving[0], similarity=saving[1]),
        route_decision=None if decision is None else ns(chosen=decision[0], by=decision[1],
                                                        candidates=decision[2], route=decision[3]),
        attempts=[{"model": m, "outcome": o} for m, o in attempts], text=text)


@functools.lru_cache(maxsize=256)
def _server(url: str) -> tuple[tuple[str, Any], ...]:
    """server.address and server.port of an upstream's URL (none without a host)."""
    where = urlsplit(url)
    if not where.hostname:
        return ()
    return ("server.address", where.hostname), ("server.port", where.port or (443 if where.scheme == "https" else 80))


def _attributes(reads: Sequence[Any] | None, provider: str, ctx: Any, content: bool) -> dict[str, Any]:
    """A span's attributes, as `reads` says to read them."""
    if reads is None:
        return {}
    what = reads[0]
    if what == "s":
        return stage_attributes(reads[1], ctx)
    if what == "r":
        attrs = request_attributes(ctx.gen, provider, stream=ctx.stream)
        attrs.update(answer_attributes(ctx))
        if content:
            attrs.update(content_attributes(ctx))
        error = error_type(ctx)
        if error is not None:
            attrs["error.type"] = error
        return attrs
    if what == "c":
        _, req, operation, model, call_provider, url, usage = reads
        attrs = request_attributes(_request(req), call_provider, model=model, operation=operation)
        attrs.update(_server(url))
        if usage is not None:
            attrs.update(usage_attributes(_usage(usage)))   # type: ignore[arg-type]
        return attrs
    if what == "i":
        _, req, operation, model, usage = reads
        attrs = request_attributes(_request(req), "tokenomy", model=model, operation=operation)
        attrs.update(usage_attributes(_usage(usage)))        # type: ignore[arg-type]
        attrs["gen_ai.response.model"] = model
        return attrs
    u = reads[1]
    if what == "p":
        return {"gen_ai.usage.input_tokens": u[0], "gen_ai.usage.cache_read.input_tokens": u[2],
                "tokenomy.engine.prefilled_tokens": max(u[0] - u[2], 0)}
    if what == "d":
        attrs = {"gen_ai.usage.output_tokens": u[1]}
        if u[4]:
            attrs["tokenomy.engine.draft_tokens"] = u[4]
            attrs["tokenomy.engine.draft_accepted"] = u[5] or 0
        return attrs
    return {}


@dataclass
class Read:
    """A span as it is exported: its ids, times (UNIX ns), attributes (None values left in) and status message."""

    name: str
    kind: str
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None
    remote: bool                  # its parent is the caller's (the request's span with a traceparent)


def read(trace: Sequence[Any]) -> tuple[str, str | None, list[Read]]:
    """(trace id hex, tracestate, its spans as they are exported) of a trace's plain form: ids drawn where none
    was, each span's attributes read from the request's facts, a span that never ended ending with the request."""
    trace_id, tracestate, remote, anchor_ns, anchor, ends, content, plain, spans = trace
    provider, ctx = _context(plain)
    ids = [s[2] or random.getrandbits(64) or 1 for s in spans]
    out = []
    for i, (name, kind, _, parent, start, end, reads, direct, error) in enumerate(spans):
        attrs: dict[str, Any] = {}
        try:
            attrs = _attributes(reads, provider, ctx, content)
        except Exception:        # one span that cannot be read loses its attributes, not its trace
            log.exception("a span's attributes could not be read")
        if direct:
            attrs.update(direct)
        if i == 0 and error is None and "error.type" in attrs:
            failed = ctx.error
            error = (failed.message[:200] if failed is not None else "") or attrs["error.type"]
        out.append(Read(name, kind, ids[i], ids[parent] if parent >= 0 else remote,
                        anchor_ns + int((start - anchor) * 1e9),
                        anchor_ns + int(((end if end is not None else ends) - anchor) * 1e9), attrs, error,
                        parent < 0))
    return trace_id, tracestate, out


class Spans:
    """A trace's plain form as the SDK's ReadableSpans of one resource (service.name) and instrumentation scope:
    what a BatchSpanProcessor takes (`on_end`) and any SpanExporter exports, the SDK's OTLP/HTTP one included
    (its public interfaces only: it encodes them with the SDK's encoder)."""

    def __init__(self, service_name: str, version: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

        self.resource = Resource.create({"service.name": service_name})
        self.scope = InstrumentationScope("tokenomy", version)
        self._readable, self._context, self._state = ReadableSpan, SpanContext, TraceState
        self._kinds = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
        self._flags = TraceFlags(TraceFlags.SAMPLED)
        self._ok, self._error = Status(StatusCode.UNSET), StatusCode.ERROR
        self._status = Status

    def __call__(self, data: Sequence[Any]) -> list[Any]:
        trace_id, tracestate, reads = read(data)
        tid = int(trace_id, 16)
        state = self._state.from_header([tracestate]) if tracestate else None
        out = []
        for r in reads:
            attributes = {k: v for k, v in r.attributes.items() if v is not None}
            context = self._context(tid, r.span_id, False, self._flags, state)
            parent = (self._context(tid, r.parent_id, r.remote, self._flags, state)
                      if r.parent_id is not None else None)
            out.append(self._readable(
                r.name, context=context, parent=parent, resource=self.resource, kind=self._kinds[r.kind],
                attributes=attributes, status=self._ok if r.error is None else self._status(self._error, r.error),
                start_time=r.start_ns, end_time=r.end_ns, instrumentation_scope=self.scope))
        return out


def feed(processor: Any, spans: Spans, data: Sequence[Any]) -> None:
    """Hand one trace's spans to `processor` (a BatchSpanProcessor); a trace that cannot be read is dropped and
    logged, not the batch it came in."""
    try:
        made = spans(data)
    except Exception:
        log.exception("a request's trace could not be exported")
        return
    for span in made:
        processor.on_end(span)


def processor(exporter: Any) -> Any:
    """The SDK's BatchSpanProcessor (OTEL_BSP_* settings; its queue bound counts spans) in front of `exporter`."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(exporter)


# ---- the gateway's side ---------------------------------------------------------------------------------------------

def _queue_size() -> int:
    try:
        return max(int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048")), 1)
    except ValueError:
        return 2048


class InProcess:
    """A given exporter (a test's in-memory one), run in the gateway's process behind its own BatchSpanProcessor:
    the same traces, read and exported from the same plain form as in the exporter process."""

    def __init__(self, exporter: Any, service_name: str, version: str) -> None:
        self.processor = processor(exporter)
        self.spans = Spans(service_name, version)
        self.dropped = 0

    def put(self, finished: tuple[Any, ...]) -> None:
        feed(self.processor, self.spans, plain_trace(finished))

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.processor.shutdown()


class ExportProcess:
    """The gateway's end of its exporter process: `put` queues a finished trace (RequestTrace.finish's tuple; on the
    request path: a length test and an append, nothing that waits), a sender thread sends what is queued every
    SEND_EVERY_S (sooner at SEND_BATCH) in one message (`dumps`), `flush` has the exporter export everything sent so
    far and says whether that worked, `shutdown` sends what is left, closes the socket and waits for the exporter to
    export and exit. Beyond the queue's bound (OTEL_BSP_MAX_QUEUE_SIZE) traces are dropped and counted
    (`dropped`)."""

    def __init__(self, endpoint: str, timeout_s: float, service_name: str, version: str) -> None:
        import socket

        self.timeout_s = timeout_s
        self.queue: deque[tuple[Any, ...]] = deque()
        self.limit = _queue_size()
        self.refused = 0                         # traces the full queue refused (the request path counts them)
        self.lost = 0                            # ... and those queued when the exporter was gone (the sender's)
        ours, theirs = socket.socketpair()
        settings = json.dumps({"endpoint": endpoint, "timeout_s": timeout_s, "service_name": service_name,
                               "version": version})
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", ENTRY, str(theirs.fileno()), settings],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self._send_lock = threading.Lock()       # one message at a time on the socket
        self._flush_lock = threading.Lock()      # one flush waiting for its answer at a time
        self._seq = 0
        self._broken = False
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenomy-trace-sender", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.refused + self.lost

    def put(self, finished: tuple[Any, ...]) -> None:
        queue = self.queue
        if len(queue) >= self.limit:
            self.refused += 1
            return
        queue.append(finished)
        if len(queue) == SEND_BATCH:
            self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(SEND_EVERY_S)
            self._wake.clear()
            self._send()

    def _send(self, *control: Any) -> bool:
        """Send what is queued (and a control message after it); False when the exporter is gone."""
        with self._send_lock:
            queue, items = self.queue, []
            while queue:
                items.append(queue.popleft())
            if self._broken:
                self.lost += len(items)
                return False
            try:
                if items:
                    data, left_out = dumps(items)
                    self.lost += left_out
                    self.conn.send_bytes(data)
                if control:
                    self.conn.send_bytes(marshal.dumps(control))
                return True
            except OSError as e:
                self._broken = True
                self.lost += len(items)
                log.warning("the trace exporter process is gone (%s, exit status %s): traces are dropped", e,
                            self.proc.poll())
                return False

    def flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._flush_lock:
            self._seq += 1
            seq = self._seq
            if not self._send("f", seq, timeout_s):
                return False
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.conn.poll(left):
                        return False
                    done, ok = marshal.loads(self.conn.recv_bytes())
                    if done >= seq:         # an answer to an earlier flush that gave up waiting is skipped
                        return bool(ok)
            except (OSError, EOFError):
                return False

    def shutdown(self) -> None:
        """Send what is queued, close the socket and wait for the exporter to export it and exit (at most a few
        export timeouts: the collector may be down), then make sure it has."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)
        self._send()
        self.conn.close()
        try:
            self.proc.wait(timeout=3 * self.timeout_s + 10)
        except subprocess.TimeoutExpired:
            log.warning("the trace exporter process did not finish exporting in time: stopped")
            self.proc.kill()
            self.proc.wait()


# ---- the exporter process -------------------------------------------------------------------------------------------

def main(fd: int, settings: str) -> None:
    """The exporter process: traces from the gateway's socket `fd` (Connection messages, marshal: a list of
    traces' plain forms, or ("f", seq, timeout_s), a flush answered with (seq, ok)) into the BatchSpanProcessor and
    the SDK OTLP/HTTP exporter. Exits when the socket closes or the parent dies, after exporting what it holds. Signals
    that stop the gateway (Ctrl-C to its process group, a service manager's SIGTERM to all of it) are the
    gateway's to act on: the exporter ends with the gateway, after what the gateway sent it last."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parent = os.getppid()
    conn = Connection(fd)
    s = json.loads(settings)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    bsp = processor(OTLPSpanExporter(endpoint=s["endpoint"], timeout=s["timeout_s"]))
    spans = Spans(s["service_name"], s["version"])
    try:
        while True:
            try:
                if not conn.poll(1.0):
                    if os.getppid() != parent:      # the gateway died and something still holds its end
                        break
                    continue
                message = marshal.loads(conn.recv_bytes())
            except (EOFError, OSError):
                break
            if isinstance(message, list):
                for trace in message:
                    feed(bsp, spans, trace)
            elif message[0] == "f":
                ok = bsp.force_flush(int(message[2] * 1000))
                try:
                    conn.send_bytes(marshal.dumps((message[1], ok)))
                except OSError:
                    break
    finally:
        bsp.shutdown()

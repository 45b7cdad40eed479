"""Traces (tokenomy/telemetry/trace.py) as a collector receives them: a real OTLP/HTTP receiver in the test decodes
what the SDK's exporter sends from a live tokenomy, on the embedded engine and in front of upstreams."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import SMALL_ENGINE, free_port, live_server
from tests.helpers.otlp_receiver import OTLPReceiver, attributes
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.config import TelemetrySettings
from tokenomy.telemetry import trace, trace_export

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name a color."}]
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def caller() -> tuple[str, str]:
    """A new trace id, and a caller's traceparent that continues it (every test its own: one collector hears all)."""
    tid = secrets.token_hex(16)
    return tid, f"00-{tid}-{CALLER_SPAN}-01"


# ---- the collector ------------------------------------------------------------------------------------------------

@dataclass
class Span:
    name: str
    kind: str                       # SERVER | CLIENT | INTERNAL
    trace_id: str
    span_id: str
    parent: str | None
    attributes: dict[str, Any]
    error: bool
    start: int
    end: int
    service: str
    children: list[Span] = field(default_factory=list)

    def child(self, name: str) -> Span:
        [found] = [c for c in self.children if c.name == name]
        return found


class Collector(OTLPReceiver):
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest; every span kept, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

        self.spans: list[Span] = []
        self._kind = ProtoSpan.SpanKind.Name
        super().__init__("/v1/traces", ExportTraceServiceRequest)

    def receive(self, request: Any) -> None:
        got = []
        for rs in request.resource_spans:
            service = attributes(rs.resource.attributes).get("service.name", "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(
                        name=s.name, kind=self._kind(s.kind).removeprefix("SPAN_KIND_"), trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(), parent=s.parent_span_id.hex() or None,
                        attributes=attributes(s.attributes), error=s.status.code == s.status.STATUS_CODE_ERROR,
                        start=s.start_time_unix_nano, end=s.end_time_unix_nano, service=service))
        with self.lock:
            self.spans.extend(got)

    def tree(self, trace_id: str, service: str | None = None) -> list[Span]:
        """The trace's root spans (those whose parent this collector did not receive), children linked."""
        spans = [s for s in self.spans if s.trace_id == trace_id and (service is None or s.service == service)]
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            s.children = sorted((c for c in spans if c.parent == s.span_id), key=lambda c: c.start)
        return [s for s in spans if s.parent not in by_id]

    def request(self, gateway: Any, trace_id: str, service: str | None = None) -> Span:
        """The SERVER span of a request's trace, once it has arrived (its request span ends last)."""
        def root() -> Span | None:
            gateway.tracer.flush()
            found = [s for s in self.tree(trace_id, service) if s.kind in ("SERVER", "INTERNAL")
                     and "gen_ai.operation.name" in s.attributes]
            return found[0] if found else None
        return wait_until(root, what=f"the request span of trace {trace_id}")


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def traced(collector: Collector, **telemetry: Any) -> dict[str, Any]:
    return {"traces": True, "endpoint": collector.url, **telemetry}


def row(gateway: Any, request_id: str) -> Any:
    assert gateway.ledger.flush()
    return gateway.ledger.get(request_id)


def upstream_config(port: int, **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{port}/v1",
                        "model": "stub-model", "tokenizer": MODEL, "max_retries": 0, "timeout_s": 30}],
            "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}}, **extra}


# ---- settings -----------------------------------------------------------------------------------------------------

def test_tracing_is_off_by_default_and_on_with_the_otel_environment_or_the_file() -> None:
    off = TelemetrySettings()
    assert trace.resolve(off, {}) is None
    s = trace.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_SERVICE_NAME": "gw"})
    assert s is not None and (s.endpoint, s.service_name) == ("http://collector:4318/v1/traces", "gw")
    s = trace.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/traces"})
    assert s is not None and s.endpoint == "http://b:4318/traces"       # the signal's own URL, taken as it is
    assert trace.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_TRACES_EXPORTER": "none"}) is None
    on = TelemetrySettings(traces=True, sample_ratio=0.25, service_name="edge")
    s = trace.resolve(on, {"OTEL_SERVICE_NAME": "gw", "OTEL_TRACES_SAMPLER": "always_off"})
    assert s is not None and (s.endpoint, s.sampler, s.service_name, s.capture_content) == (
        trace.DEFAULT_ENDPOINT, (True, 0.25), "edge", False)
    for sampler, arg, expected in (("", "", (True, 1.0)), ("always_off", "", (False, 0.0)),
                                   ("traceidratio", "0.1", (False, 0.1)),
                                   ("parentbased_traceidratio", "2", (True, 1.0)), ("nonsense", "", (True, 1.0))):
        s = trace.resolve(TelemetrySettings(traces=True), {"OTEL_TRACES_SAMPLER": sampler,
                                                           "OTEL_TRACES_SAMPLER_ARG": arg})
        assert s is not None and s.sampler == expected, sampler
    assert trace.resolve(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert trace.resolve(TelemetrySettings(traces=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"}) is None


def test_trace_ids_of_traceparent_headers() -> None:
    assert trace.trace_id_of(TRACEPARENT) == CALLER_TRACE
    assert trace.trace_id_of(TRACEPARENT.upper()) == CALLER_TRACE
    for bad in ("", "garbage", f"00-{'0' * 32}-{CALLER_SPAN}-01", f"00-{CALLER_TRACE[:-1]}-{CALLER_SPAN}-01"):
        assert trace.trace_id_of(bad) is None


def test_the_export_thread_makes_sdk_spans_ending_a_late_span_with_its_request() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from tokenomy.generation import GenRequest
    from tokenomy.pipeline.request import RequestContext

    memory = InMemorySpanExporter()
    settings = trace.resolve(TelemetrySettings(traces=True), {})
    assert settings is not None
    tracer = trace.Tracer(settings, {}, exporter=memory)
    tid, parent = caller()
    ctx = RequestContext(gen=GenRequest(model="m"), headers={"traceparent": parent, "tracestate": "a=1"})
    tracer.start(ctx)
    late = ctx.trace.root.child("generate")                # never finished: a stream the client left
    ctx.trace.finish(ctx, time.perf_counter())
    assert tracer.flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) == {"chat m", "generate", "record"}
    root = spans["chat m"]
    assert (root.kind, format(root.context.trace_id, "032x"), root.parent.is_remote) == (SpanKind.SERVER, tid, True)
    assert format(root.parent.span_id, "016x") == CALLER_SPAN and root.context.trace_state.get("a") == "1"
    assert spans["generate"].end_time == root.end_time and spans["generate"].parent.span_id == root.context.span_id
    assert late.end is None and not spans["generate"].parent.is_remote
    tracer.shutdown()


def test_the_spans_handed_to_the_sdk_encode_as_otlp_with_the_traces_ids_kinds_and_attributes() -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tokenomy.generation import GenRequest
    from tokenomy.pipeline.request import RequestContext

    settings = trace.resolve(TelemetrySettings(traces=True), {})
    assert settings is not None
    tracer = trace.Tracer(settings, {}, exporter=InMemorySpanExporter())
    sent: list[Any] = []
    tracer.sink.put = sent.append          # type: ignore[method-assign]   (the finished trace, as queued)
    tid, parent = caller()
    ctx = RequestContext(gen=GenRequest(model="m"), headers={"traceparent": parent, "tracestate": "a=1, b=2"})
    tracer.start(ctx)
    t = ctx.trace
    t.root.attributes.update({"s": "naïve ✓", "t": True, "i": 7, "neg": -3, "x": 0.25, "words": ["a", "b"],
                              "gone": None})
    call = t.root.child("chat 模型", kind="client", attributes={"server.port": 443})
    call.fail("rate_limit_exceeded", "slow down")
    call.finish()
    t.root.child("generate")                   # never finished: ends with the request
    t.finish(ctx, time.perf_counter())
    tracer.shutdown()
    spans = trace_export.Spans("edge", "1.2.3")(trace_export.plain_trace(sent[0]))     # as the exporter makes them
    [rs] = encode_spans(spans).resource_spans
    assert attributes(rs.resource.attributes)["service.name"] == "edge"
    [ss] = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("tokenomy", "1.2.3")
    by_name = {s.name: s for s in ss.spans}
    assert len(ss.spans) == 4 and {s.trace_id.hex() for s in ss.spans} == {tid}
    root, failed = by_name["chat m"], by_name["chat 模型"]
    assert root.parent_span_id.hex() == CALLER_SPAN and root.trace_state == "a=1,b=2"
    assert failed.parent_span_id == root.span_id and failed.kind == failed.SpanKind.SPAN_KIND_CLIENT
    assert (failed.status.code, failed.status.message) == (failed.status.STATUS_CODE_ERROR, "slow down")
    got = attributes(root.attributes)
    assert {k: got[k] for k in ("s", "t", "i", "neg", "x", "words")} == {
        "s": "naïve ✓", "t": True, "i": 7, "neg": -3, "x": 0.25, "words": ["a", "b"]} and "gone" not in got


# ---- the embedded engine ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine_server(collector: Collector) -> Iterator[Any]:
    cache = {"exact": {"enabled": True}, "semantic": {"enabled": False}}
    with live_server({"engine": SMALL_ENGINE, "cache": cache, "telemetry": traced(collector)}) as s:
        yield s


def test_a_request_is_one_server_span_continuing_the_callers_trace_with_its_stages_and_the_engine(
        engine_server: Any, collector: Collector) -> None:
    tid, parent = caller()
    r = httpx.post(engine_server.base_url + "/chat/completions", timeout=120, headers={"traceparent": parent},
                   json={"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0, "seed": 3,
                         "top_p": 0.5})
    assert r.status_code == 200
    body, rid = r.json(), r.headers["x-tokenomy-request-id"]
    span = collector.request(engine_server.gateway, tid)
    assert (span.name, span.kind, span.parent, span.error) == (f"chat {MODEL}", "SERVER", CALLER_SPAN, False)
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "tokenomy"
    assert (a["gen_ai.request.model"], a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"], a["gen_ai.request.seed"], a["gen_ai.request.stream"]) == (
        MODEL, 4, 0.0, 0.5, 3, False)
    assert (a["gen_ai.response.id"], a["gen_ai.response.model"], a["gen_ai.response.finish_reasons"]) == (
        body["id"], MODEL, [body["choices"][0]["finish_reason"]])
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    assert a["gen_ai.usage.cache_read.input_tokens"] == body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert (a["tokenomy.tenant"], a["tokenomy.request_id"], a["tokenomy.cache"]) == ("default", rid, "miss")
    assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a     # no content by default
    assert [c.name for c in span.children] == ["admit", "context", "cache", "route", "generate", "record"]
    assert all(c.kind == "INTERNAL" and span.start <= c.start <= c.end <= span.end for c in span.children)
    assert span.child("cache").attributes["tokenomy.cache.outcome"] == "miss"
    route = span.child("route").attributes
    assert (route["tokenomy.route.chosen"], route["tokenomy.route.by"]) == (MODEL, "pinned")
    assert span.child("context").attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    [inference] = span.child("generate").children
    assert (inference.name, inference.kind) == (f"chat {MODEL}", "INTERNAL")
    assert inference.attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert [c.name for c in inference.children] == ["queue", "prefill", "decode"]
    queue, prefill, decode = inference.children
    assert queue.end <= prefill.start + 1 and prefill.end <= decode.start + 1    # one after the other
    assert prefill.attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert decode.attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert row(engine_server.gateway, rid).trace_id == tid               # the bill line leads to its trace

    again = httpx.post(engine_server.base_url + "/chat/completions", timeout=120,
                       json={"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0, "seed": 3,
                             "top_p": 0.5})
    assert again.headers["x-tokenomy-cache"] == "exact"
    started = row(engine_server.gateway, again.headers["x-tokenomy-request-id"]).trace_id
    assert started and started != tid                                   # no traceparent: a trace starts here
    hit = collector.request(engine_server.gateway, started)
    assert hit.parent is None and hit.attributes["tokenomy.cache"] == "exact"
    assert [c.name for c in hit.children] == ["admit", "context", "cache", "record"]   # a hit ends the chain
    assert hit.child("cache").attributes["tokenomy.cache.outcome"] == "exact"


def test_a_streamed_completion_is_traced_to_its_last_event_and_a_refusal_is_an_error_span(
        engine_server: Any, collector: Collector) -> None:
    with httpx.stream("POST", engine_server.base_url + "/completions", timeout=120,
                      json={"model": MODEL, "prompt": "Red, green,", "max_tokens": 3, "temperature": 0,
                            "stream": True}) as r:
        assert r.status_code == 200
        rid = r.headers["x-tokenomy-request-id"]
        events = [line for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    span = collector.request(engine_server.gateway, row(engine_server.gateway, rid).trace_id)
    a = span.attributes
    assert span.name == f"text_completion {MODEL}" and a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.id"].startswith("cmpl-") and a["gen_ai.usage.output_tokens"] >= 1
    generate = span.child("generate")
    assert generate.end >= generate.children[0].end       # a streamed answer's stage works until its last event
    assert span.child("cache").attributes["tokenomy.cache.outcome"] == "miss"

    tid, parent = caller()
    bad = httpx.post(engine_server.base_url + "/chat/completions", headers={"traceparent": parent},
                     json={"model": "no-such-model", "messages": HELLO}, timeout=30)
    assert bad.status_code == 404
    span = collector.request(engine_server.gateway, tid)
    assert span.error and span.attributes["error.type"] == "model_not_found"
    assert span.attributes["http.response.status_code"] == 404
    route = span.child("route")
    assert route.error and route.attributes["error.type"] == "model_not_found"
    assert "generate" not in [c.name for c in span.children]


# ---- upstreams ----------------------------------------------------------------------------------------------------

def test_an_upstream_call_is_a_client_span_whose_traceparent_the_upstream_receives(collector: Collector) -> None:
    stub, (tid, parent) = Stub(), caller()
    with StubServer(stub) as s, live_server(upstream_config(s.port, telemetry=traced(collector))) as gw:
        r = httpx.post(gw.base_url + "/chat/completions", headers={"traceparent": parent}, timeout=30,
                       json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": True})
        assert r.status_code == 200
        span = collector.request(gw.gateway, tid)
        rid = r.headers["x-tokenomy-request-id"]
        assert row(gw.gateway, rid).trace_id == tid
    a = span.attributes
    assert (a["gen_ai.provider.name"], a["gen_ai.request.model"], a["gen_ai.response.model"]) == (
        "openai", "remote", "remote")
    [call] = span.child("generate").children
    assert (call.name, call.kind, call.error) == ("chat stub-model", "CLIENT", False)
    c = call.attributes
    assert (c["gen_ai.provider.name"], c["gen_ai.request.model"], c["server.address"], c["server.port"]) == (
        "openai", "stub-model", "127.0.0.1", s.port)
    assert (c["gen_ai.usage.input_tokens"], c["gen_ai.response.finish_reasons"]) == (7, ["stop"])
    sent = stub.headers[-1]["traceparent"]
    assert sent == f"00-{tid}-{call.span_id}-01"      # the upstream continues the trace under the call


def test_an_embeddings_request_is_traced_through_its_embed_stage_to_the_upstream(collector: Collector) -> None:
    stub, (tid, parent) = Stub(), caller()
    with StubServer(stub) as s, live_server(upstream_config(s.port, telemetry=traced(collector))) as gw:
        r = httpx.post(gw.base_url + "/embeddings", headers={"traceparent": parent}, timeout=30,
                       json={"model": "remote", "input": ["a red apple", "a green pear"]})
        assert r.status_code == 200
        span = collector.request(gw.gateway, tid)
        bad_tid, bad_parent = caller()        # a body refused before the pipeline is one span too
        bad = httpx.post(gw.base_url + "/chat/completions", content=b"{not json", timeout=30,
                         headers={"traceparent": bad_parent, "content-type": "application/json"})
        assert bad.status_code == 400
        refused = collector.request(gw.gateway, bad_tid)
    assert refused.error and refused.attributes["http.response.status_code"] == 400
    assert [c.name for c in refused.children] == ["record"]
    assert (span.name, span.attributes["gen_ai.operation.name"]) == ("embeddings remote", "embeddings")
    assert [c.name for c in span.children] == ["admit", "embed", "record"]
    [call] = span.child("embed").children
    assert (call.name, call.kind) == ("embeddings stub-model", "CLIENT")
    assert call.attributes["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert stub.headers[-1]["traceparent"] == f"00-{tid}-{call.span_id}-01"


def test_an_anthropic_upstream_call_is_a_client_span_with_its_traceparent(
        collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.messages_stub import MessagesStub

    monkeypatch.setenv("TOKENOMY_TEST_TRACE_KEY", "sk-test")
    stub, (tid, parent) = MessagesStub(key="sk-test"), caller()
    models = [{"name": "claude", "backend": "anthropic", "base_url": "", "model": "claude-stub",
               "api_key_env": "TOKENOMY_TEST_TRACE_KEY", "timeout_s": 10, "max_retries": 0}]
    with StubServer(stub) as s:           # type: ignore[arg-type]   (any ASGI app)
        models[0]["base_url"] = f"http://127.0.0.1:{s.port}"
        with live_server({"models": models, "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}},
                          "telemetry": traced(collector)}) as gw:
            r = httpx.post(gw.base_url + "/chat/completions", headers={"traceparent": parent}, timeout=30,
                           json={"model": "claude", "messages": HELLO, "max_tokens": 16})
            assert r.status_code == 200
            span = collector.request(gw.gateway, tid)
    assert span.attributes["gen_ai.provider.name"] == "anthropic"
    [call] = span.child("generate").children
    assert (call.name, call.kind, call.attributes["gen_ai.provider.name"]) == (
        "chat claude-stub", "CLIENT", "anthropic")
    assert call.attributes["gen_ai.usage.input_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert stub.requests[-1]["headers"]["traceparent"] == f"00-{tid}-{call.span_id}-01"


def test_tracing_off_sends_no_traceparent_makes_no_tracer_and_still_keeps_a_callers_trace_id() -> None:
    stub = Stub()
    with StubServer(stub) as s, live_server(upstream_config(s.port)) as gw:
        assert gw.gateway.tracer is None
        r = httpx.post(gw.base_url + "/chat/completions", headers={"traceparent": TRACEPARENT}, timeout=30,
                       json={"model": "remote", "messages": HELLO, "max_tokens": 5})
        plain = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5})
        assert row(gw.gateway, r.headers["x-tokenomy-request-id"]).trace_id == CALLER_TRACE
        assert row(gw.gateway, plain.headers["x-tokenomy-request-id"]).trace_id is None
    assert "traceparent" not in stub.headers[-1]


def test_content_is_recorded_only_when_opted_in_and_only_for_tenants_whose_bodies_the_ledger_keeps(
        collector: Collector, tmp_path: Any) -> None:
    keys = [{"name": "a", "key": "sk-a", "tenant": "acme"}, {"name": "b", "key": "sk-b", "tenant": "globex"}]
    ledger = {"url": f"sqlite:///{tmp_path}/ledger.db", "store_prompts": True, "store_prompts_tenants": ["acme"]}
    with StubServer(Stub()) as s, live_server(upstream_config(
            s.port, keys=keys, ledger=ledger, telemetry=traced(collector, capture_content=True))) as gw:
        spans = {}
        for key, tenant in (("sk-a", "acme"), ("sk-b", "globex")):
            r = httpx.post(gw.base_url + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5}, timeout=30)
            assert r.status_code == 200
            spans[tenant] = collector.request(gw.gateway, row(gw.gateway, r.headers["x-tokenomy-request-id"]).trace_id)
    acme = spans["acme"].attributes
    assert json.loads(acme["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Name a color."}]}]
    [out] = json.loads(acme["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "stop" and out["parts"][0]["content"]
    assert acme["tokenomy.tenant"] == "acme" and spans["globex"].attributes["tokenomy.tenant"] == "globex"
    assert "gen_ai.input.messages" not in spans["globex"].attributes
    assert "gen_ai.output.messages" not in spans["globex"].attributes


def test_an_unsampled_trace_exports_nothing_but_still_propagates_and_a_callers_sampled_flag_is_followed(
        collector: Collector) -> None:
    stub = Stub()
    with StubServer(stub) as s, live_server(upstream_config(s.port, telemetry=traced(collector,
                                                                                     sample_ratio=0))) as gw:
        r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                       json={"model": "remote", "messages": HELLO, "max_tokens": 5})
        dropped = row(gw.gateway, r.headers["x-tokenomy-request-id"]).trace_id
        assert stub.headers[-1]["traceparent"].startswith(f"00-{dropped}-")
        assert stub.headers[-1]["traceparent"].endswith("-00")           # the upstream learns it is not sampled
        tid, parent = caller()                                             # the caller's sampled flag: kept
        r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                       headers={"traceparent": parent, "tracestate": "vendor=x"},
                       json={"model": "remote", "messages": HELLO, "max_tokens": 5})
        span = collector.request(gw.gateway, tid)
        assert stub.headers[-1]["tracestate"] == "vendor=x"
        assert gw.gateway.tracer.flush()
    assert span.parent == CALLER_SPAN
    assert not [x for x in collector.spans if x.trace_id == dropped]


def test_a_collector_that_is_down_never_fails_a_request() -> None:
    closed = free_port()             # nothing listens there
    with StubServer(Stub()) as s, live_server(upstream_config(
            s.port, telemetry={"traces": True, "endpoint": f"http://127.0.0.1:{closed}/v1/traces",
                               "timeout_s": 1})) as gw:
        for i in range(5):
            r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": i % 2 == 1})
            assert r.status_code == 200
            assert row(gw.gateway, r.headers["x-tokenomy-request-id"]).trace_id
        t0 = time.monotonic()
        assert gw.gateway.tracer.flush(timeout_s=30) in (True, False)     # an export that fails is dropped
        assert time.monotonic() - t0 < 30


def test_a_trace_runs_through_a_pool_of_two_tokenomy_replicas_to_the_upstream(collector: Collector) -> None:
    stub = Stub()
    with StubServer(stub) as s, \
            live_server(upstream_config(s.port, telemetry=traced(collector, service_name="replica-1"))) as r1, \
            live_server(upstream_config(s.port, telemetry=traced(collector, service_name="replica-2"))) as r2, \
            live_server({"models": [{"name": "pool", "backend": "openai", "model": "remote",
                                     "replicas": [r1.base_url, r2.base_url], "tokenizer": MODEL,
                                     "balance": {"check_interval_s": 0}}],
                         "cache": {"exact": {"enabled": False}, "semantic": {"enabled": False}},
                         "telemetry": traced(collector, service_name="edge")}) as edge:
        for i in range(4):
            tid, parent = caller()
            r = httpx.post(edge.base_url + "/chat/completions", timeout=30, headers={"traceparent": parent},
                           json={"model": "pool", "messages": HELLO, "max_tokens": 5, "stream": i % 2 == 0})
            assert r.status_code == 200
            front = collector.request(edge.gateway, tid, "edge")
            [call] = front.child("generate").children
            assert call.kind == "CLIENT" and call.attributes["server.port"] in (r1.port, r2.port)
            replica, served_by = (r1, "replica-1") if call.attributes["server.port"] == r1.port else (r2, "replica-2")
            behind = collector.request(replica.gateway, tid, served_by)
            assert (behind.kind, behind.parent) == ("SERVER", call.span_id)      # the replica continues the call
            [upstream] = behind.child("generate").children
            assert stub.headers[-1]["traceparent"] == f"00-{tid}-{upstream.span_id}-01"
            assert row(edge.gateway, r.headers["x-tokenomy-request-id"]).trace_id == tid
            assert replica.gateway.ledger.flush()
            assert [x.trace_id for x in replica.gateway.ledger.query() if x.trace_id == tid] == [tid]

"""OTel GenAI metrics (tokenomy/telemetry/otel_metrics.py) as a collector receives them: a real OTLP/HTTP receiver in
the test decodes what the SDK's periodic reader exports from a live tokenomy, on the embedded engine and in front of
an upstream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import SMALL_ENGINE, free_port, live_server
from tests.helpers.otlp_receiver import OTLPReceiver, attributes
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tokenomy.config import TelemetrySettings
from tokenomy.telemetry import otel_metrics

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name a color."}]
NO_CACHE = {"exact": {"enabled": False}, "semantic": {"enabled": False}}
NAMES = {otel_metrics.REQUEST_DURATION, otel_metrics.TIME_TO_FIRST_TOKEN, otel_metrics.TIME_PER_OUTPUT_TOKEN,
         otel_metrics.TOKEN_USAGE}


# ---- the collector ------------------------------------------------------------------------------------------------

@dataclass
class Point:
    """One histogram's data point for one attribute set, as last exported (cumulative: the totals so far)."""

    unit: str
    count: int
    sum: float
    bounds: tuple[float, ...]
    service: str


class Collector(OTLPReceiver):
    """An OTLP/HTTP metrics receiver: POST /v1/metrics with an ExportMetricsServiceRequest; the latest point of every
    (metric, attributes) kept, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        self.points: dict[tuple[str, frozenset[tuple[str, Any]]], Point] = {}
        super().__init__("/v1/metrics", ExportMetricsServiceRequest)

    def receive(self, request: Any) -> None:
        got = {}
        for rm in request.resource_metrics:
            service = attributes(rm.resource.attributes).get("service.name", "")
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    assert m.WhichOneof("data") == "histogram", m.name
                    for p in m.histogram.data_points:
                        attrs = frozenset(attributes(p.attributes).items())
                        got[(m.name, attrs)] = Point(m.unit, p.count, p.sum, tuple(p.explicit_bounds), service)
        with self.lock:
            self.points.update(got)

    def of(self, name: str) -> dict[frozenset[tuple[str, Any]], Point]:
        with self.lock:
            return {attrs: p for (n, attrs), p in self.points.items() if n == name}

    def count(self, name: str) -> int:
        return sum(p.count for p in self.of(name).values())


def find(points: dict[frozenset[tuple[str, Any]], Point],
         want: dict[str, Any]) -> list[tuple[dict[str, Any], Point]]:
    """The points whose attributes include `want`'s."""
    return [(dict(a), p) for a, p in points.items() if all(dict(a).get(k) == v for k, v in want.items())]


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


# ---- settings -----------------------------------------------------------------------------------------------------

def test_otel_metrics_are_off_by_default_and_on_with_the_otel_environment_or_the_file() -> None:
    off = TelemetrySettings()
    assert otel_metrics.resolve(off, {}) is None
    s = otel_metrics.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_SERVICE_NAME": "gw"})
    assert s is not None and (s.endpoint, s.service_name, s.interval_s) == (
        "http://collector:4318/v1/metrics", "gw", 60.0)
    s = otel_metrics.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                                   "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://b:4318/m",
                                   "OTEL_METRIC_EXPORT_INTERVAL": "2500"})
    assert s is not None and (s.endpoint, s.interval_s) == ("http://b:4318/m", 2.5)    # the signal's own URL
    assert otel_metrics.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                                      "OTEL_METRICS_EXPORTER": "none"}) is None
    bad = otel_metrics.resolve(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                                     "OTEL_METRIC_EXPORT_INTERVAL": "soon"})
    assert bad is not None and bad.interval_s == 60.0
    on = TelemetrySettings(metrics=True, metrics_interval_s=0.5, service_name="edge")
    s = otel_metrics.resolve(on, {"OTEL_SERVICE_NAME": "gw", "OTEL_METRIC_EXPORT_INTERVAL": "9000"})
    assert s is not None and (s.endpoint, s.interval_s, s.service_name) == (otel_metrics.DEFAULT_ENDPOINT, 0.5, "edge")
    assert otel_metrics.resolve(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert otel_metrics.resolve(TelemetrySettings(metrics=False),
                                {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318"}) is None
    # traces and metrics are apart: one on leaves the other as it is
    assert otel_metrics.resolve(TelemetrySettings(traces=True), {}) is None
    from tokenomy.telemetry import trace
    assert trace.resolve(on, {}) is None


def test_the_record_stage_records_billed_tokens_successful_times_and_every_failure_by_its_error_type() -> None:
    """Through the Record stage in process (the SDK's in-memory reader): a cache hit's time but no tokens, each
    model's tokens of a token-routed answer and of a cascade's discarded answer, a cancelled request's tokens and
    error.type but no times, an embedding's input tokens only."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tokenomy.generation import GenRequest, Usage
    from tokenomy.metrics.prometheus import Metrics
    from tokenomy.pipeline.record import Record
    from tokenomy.pipeline.request import RequestContext

    reader = InMemoryMetricReader()
    metrics = Metrics()
    metrics.names = {"small", "big", "route"}
    settings = otel_metrics.resolve(TelemetrySettings(metrics=True), {})
    assert settings is not None
    otel = otel_metrics.OtelMetrics(settings, {"small": "tokenomy", "big": "openai"},
                                    {"big": ("big.example", 443)}, label=metrics.label, reader=reader)
    record = Record(metrics, otel=otel)

    def finish(model: str, served: str | None, **fields: Any) -> None:
        ctx = RequestContext(gen=GenRequest(model=model, kind=fields.pop("kind", "chat")))
        ctx.model = served
        for k, v in fields.items():
            setattr(ctx, k, v)
        record.finish(ctx)

    finish("small", "small", cache="exact", finish_reason="stop",
           usage=Usage(prompt_tokens=5, completion_tokens=3, ttft_s=0.001, e2e_s=0.002))
    finish("route", "small", finish_reason="stop", usage=Usage(
        prompt_tokens=10, completion_tokens=8, ttft_s=0.05, e2e_s=0.4,
        parts=[("small", Usage(prompt_tokens=10, completion_tokens=6)), ("big", Usage(completion_tokens=2))]),
        escalations=[("big", Usage(prompt_tokens=11, completion_tokens=4))])
    finish("made-up", "small", finish_reason="cancelled",
           usage=Usage(prompt_tokens=9, completion_tokens=2, ttft_s=0.1, e2e_s=0.3))
    finish("small", "small", kind="embedding", usage=Usage(prompt_tokens=12))

    assert len(otel.pending) == 4                 # the request path only queued them
    got: dict[str, list[tuple[dict[str, Any], int, float]]] = {}
    data = reader.get_metrics_data()          # collects: the queued requests are measured first
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                got[m.name] = [(dict(p.attributes), p.count, p.sum) for p in m.data.data_points]
    assert not otel.pending
    otel.shutdown()

    def points(name: str, **want: Any) -> list[tuple[int, float]]:
        return sorted((n, total) for a, n, total in got[name]
                      if all(a.get(k.replace("__", ".")) == v for k, v in want.items()))

    assert sum(n for _, n, _ in got[otel_metrics.REQUEST_DURATION]) == 4
    [(cancelled, _, _)] = [p for p in got[otel_metrics.REQUEST_DURATION] if "error.type" in p[0]]
    assert cancelled["error.type"] == "cancelled" and cancelled["gen_ai.request.model"] == "other"
    assert sum(n for _, n, _ in got[otel_metrics.TIME_TO_FIRST_TOKEN]) == 2     # the hit and the routed answer
    assert points(otel_metrics.TIME_PER_OUTPUT_TOKEN) == [(1, pytest.approx(0.001 / 2)), (1, pytest.approx(0.35 / 7))]
    assert points(otel_metrics.TOKEN_USAGE, gen_ai__token__type="input", gen_ai__response__model="big") == [
        (2, 11)]                                                   # the routed part (0) and the escalation (11)
    [(big, _, _)] = [p for p in got[otel_metrics.TOKEN_USAGE] if p[0].get("gen_ai.response.model") == "big"
                     and p[0]["gen_ai.token.type"] == "output"]
    assert (big["gen_ai.provider.name"], big["server.address"], big["server.port"]) == ("openai", "big.example", 443)
    assert points(otel_metrics.TOKEN_USAGE, gen_ai__token__type="output", gen_ai__response__model="big") == [(2, 6)]
    small_in = points(otel_metrics.TOKEN_USAGE, gen_ai__token__type="input", gen_ai__response__model="small")
    assert small_in == [(1, 9), (1, 10), (1, 12)]                 # cancelled, routed, embedding; never the hit's 5
    assert points(otel_metrics.TOKEN_USAGE, gen_ai__operation__name="embeddings", gen_ai__token__type="output") == []


# ---- the embedded engine ------------------------------------------------------------------------------------------

def test_a_live_gateway_exports_the_four_genai_metrics_in_the_conventions_names_units_and_buckets(
        collector: Collector) -> None:
    telemetry = {"metrics": True, "metrics_endpoint": collector.url, "metrics_interval_s": 0.2,
                 "service_name": "otel-metrics-test"}
    with live_server({"engine": SMALL_ENGINE, "cache": NO_CACHE, "telemetry": telemetry}) as s:
        assert s.gateway.tracer is None                          # metrics on, traces left off
        chat = httpx.post(s.base_url + "/chat/completions", timeout=120,
                          json={"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0})
        assert chat.status_code == 200
        with httpx.stream("POST", s.base_url + "/completions", timeout=120,
                          json={"model": MODEL, "prompt": "Red, green,", "max_tokens": 3, "temperature": 0,
                                "stream": True}) as r:
            assert r.status_code == 200
            rid = r.headers["x-tokenomy-request-id"]
            assert [line for line in r.iter_lines() if line.startswith("data:")][-1] == "data: [DONE]"
        bad = httpx.post(s.base_url + "/chat/completions", json={"model": "no-such-model", "messages": HELLO},
                         timeout=30)
        assert bad.status_code == 404
        assert s.gateway.ledger.flush()
        streamed = s.gateway.ledger.get(rid)
        usage = {"chat": (chat.json()["usage"]["prompt_tokens"], chat.json()["usage"]["completion_tokens"]),
                 "text_completion": (streamed.prompt_tokens, streamed.completion_tokens)}
        # the reader exports every 0.2 s on its own thread: wait for the three requests' points
        wait_until(lambda: collector.count(otel_metrics.REQUEST_DURATION) == 3
                   and collector.count(otel_metrics.TOKEN_USAGE) == 4, what="the three requests' points")
    assert {n for n, _ in collector.points} == NAMES

    base = {"gen_ai.provider.name": "tokenomy", "gen_ai.request.model": MODEL, "gen_ai.response.model": MODEL}
    duration = collector.of(otel_metrics.REQUEST_DURATION)
    for p in duration.values():
        assert (p.unit, p.bounds, p.service) == ("s", otel_metrics.DURATION_BUCKETS, "otel-metrics-test")
    ok = {dict(a)["gen_ai.operation.name"]: p for a, p in duration.items() if "error.type" not in dict(a)}
    assert set(ok) == {"chat", "text_completion"} and all(p.count == 1 and p.sum > 0 for p in ok.values())
    for op in ok:
        assert find(duration, {"gen_ai.operation.name": op})[0][0] == {"gen_ai.operation.name": op, **base}
    [(failed, p)] = find(duration, {"error.type": "model_not_found"})
    assert p.count == 1 and failed == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "tokenomy",
                                       "gen_ai.request.model": "other", "error.type": "model_not_found"}

    ttft = collector.of(otel_metrics.TIME_TO_FIRST_TOKEN)
    assert sorted(dict(a)["gen_ai.operation.name"] for a in ttft) == ["chat", "text_completion"]
    assert all((p.unit, p.bounds, p.count) == ("s", otel_metrics.TTFT_BUCKETS, 1) for p in ttft.values())
    assert all("error.type" not in dict(a) for a in ttft)          # successful answers only

    tpot = collector.of(otel_metrics.TIME_PER_OUTPUT_TOKEN)        # an answer of more than one token
    assert sorted(dict(a)["gen_ai.operation.name"] for a in tpot) == sorted(
        op for op, (_, out) in usage.items() if out > 1)
    assert all((p.unit, p.bounds, p.count) == ("s", otel_metrics.TPOT_BUCKETS, 1) for p in tpot.values())

    tokens = collector.of(otel_metrics.TOKEN_USAGE)
    for op, (prompt, completion) in usage.items():
        for kind, n in (("input", prompt), ("output", completion)):
            [(attrs, p)] = find(tokens, {"gen_ai.operation.name": op, "gen_ai.token.type": kind})
            assert attrs == {"gen_ai.operation.name": op, **base, "gen_ai.token.type": kind}
            assert (p.unit, p.bounds, p.count, p.sum) == ("{token}", otel_metrics.TOKEN_BUCKETS, 1, n)


# ---- upstreams, the environment, off, a collector down ----------------------------------------------------------

def upstream_config(port: int, **extra: Any) -> dict[str, Any]:
    return {"models": [{"name": "remote", "backend": "openai", "base_url": f"http://127.0.0.1:{port}/v1",
                        "model": "stub-model", "tokenizer": MODEL, "max_retries": 0, "timeout_s": 30}],
            "cache": NO_CACHE, **extra}


def test_the_environment_turns_metrics_on_and_an_upstreams_tokens_carry_its_address_and_off_exports_nothing(
        collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    with StubServer(Stub()) as stub:
        with live_server(upstream_config(stub.port, telemetry={"metrics": False})) as off:
            assert off.gateway.otel_metrics is None                # the file's false wins over the environment
            r = httpx.post(off.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5})
            assert r.status_code == 200
        assert collector.posts == 0                               # the gateway closed: nothing was ever sent

        with live_server(upstream_config(stub.port)) as gw:
            assert gw.gateway.otel_metrics is not None and gw.gateway.tracer is None
            assert gw.gateway.otel_metrics.settings.interval_s == 0.2
            r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": True})
            assert r.status_code == 200
            wait_until(lambda: collector.count(otel_metrics.TOKEN_USAGE) == 2, what="the upstream's tokens")
    tokens = collector.of(otel_metrics.TOKEN_USAGE)
    [(attrs, p)] = find(tokens, {"gen_ai.token.type": "input"})
    assert attrs == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                     "gen_ai.request.model": "remote", "gen_ai.response.model": "remote",
                     "server.address": "127.0.0.1", "server.port": stub.port, "gen_ai.token.type": "input"}
    assert p.sum == 7                                              # the stub's prompt_tokens
    [(_, p)] = find(collector.of(otel_metrics.REQUEST_DURATION), {"gen_ai.provider.name": "openai"})
    assert p.count == 1


def test_a_collector_that_is_down_never_fails_a_request() -> None:
    closed = free_port()             # nothing listens there
    telemetry = {"metrics": True, "metrics_endpoint": f"http://127.0.0.1:{closed}/v1/metrics",
                 "metrics_interval_s": 0.1, "timeout_s": 1}
    with StubServer(Stub()) as s, live_server(upstream_config(s.port, telemetry=telemetry)) as gw:
        for i in range(5):
            r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": i % 2 == 1})
            assert r.status_code == 200
        t0 = time.monotonic()
        assert gw.gateway.otel_metrics.flush(timeout_s=5) in (True, False)     # an export that fails is dropped
        assert time.monotonic() - t0 < 30

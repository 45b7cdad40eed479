"""The trace exporter process (tokenomy/telemetry/trace_export.py): spans reach a real OTLP/HTTP receiver through it
from a gateway run as a user runs it, it never outlives its gateway (even one killed by SIGKILL), a gateway's
shutdown exports what it had queued, and the gateway's queue is bounded without ever waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.conftest import free_port, live_server
from tests.helpers.upstream_stub import Stub
from tests.helpers.wait import wait_until
from tests.pipeline.test_gateway_upstream import StubServer
from tests.telemetry.test_trace import HELLO, Collector, caller, traced, upstream_config
from tokenomy.config import TelemetrySettings
from tokenomy.generation import GenRequest
from tokenomy.pipeline.request import RequestContext
from tokenomy.telemetry import trace, trace_export

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def exporters(pid: int) -> list[psutil.Process]:
    """The trace exporter processes under process `pid`."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if trace_export.ENTRY in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE       # exited; whoever adopted it has not reaped it yet
    except psutil.NoSuchProcess:
        return True


def test_spans_reach_the_collector_through_the_exporter_process_which_dies_with_a_gateway_killed_by_sigkill(
        collector: Collector, tmp_path: Path) -> None:
    stub, (tid, parent) = Stub(), caller()
    with StubServer(stub) as s:
        config = upstream_config(s.port, telemetry=traced(collector, service_name="killed"),
                                 ledger=f"sqlite:///{tmp_path}/ledger.db")
        config["cache"]["path"] = str(tmp_path / "cache")
        path = tmp_path / "tokenomy.yaml"
        path.write_text(yaml.safe_dump(config))
        port, log = free_port(), tmp_path / "serve.log"
        env = {**os.environ, "TOKENOMY_HOME": str(tmp_path), "OTEL_BSP_SCHEDULE_DELAY": "100"}   # sent every 0.1 s
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli", "serve", "--port", str(port), "-c",
                                     str(path)], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            def up() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, timeout=120, interval=0.1, what="tokenomy serve to answer")
            [exporter] = exporters(proc.pid)
            assert exporter.ppid() == proc.pid
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={"traceparent": parent},
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": True}, timeout=30)
            assert r.status_code == 200
            # nobody flushes: the gateway's sender and the exporter's batch processor deliver it on their own
            wait_until(lambda: [x for x in collector.spans if x.trace_id == tid and x.service == "killed"
                                and x.kind == "SERVER"], what="the request's span at the collector")
            names = {x.name for x in collector.spans if x.trace_id == tid}
            assert {"chat remote", "admit", "generate", "chat stub-model", "record"} <= names
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            wait_until(lambda: gone(exporter), what="the exporter to exit after its gateway was killed")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_gateways_shutdown_exports_what_it_had_queued_and_ends_its_exporter(
        collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")    # the exporter would hold the spans for ten minutes
    tid, parent = caller()
    with StubServer(Stub()) as s, live_server(upstream_config(s.port, telemetry=traced(collector))) as gw:
        sink = gw.gateway.tracer.sink
        assert isinstance(sink, trace_export.ExportProcess) and sink.proc.poll() is None
        r = httpx.post(gw.base_url + "/chat/completions", headers={"traceparent": parent}, timeout=30,
                       json={"model": "remote", "messages": HELLO, "max_tokens": 5})
        assert r.status_code == 200
    assert sink.proc.poll() is not None                     # the shutdown waited for the exporter to finish
    assert [x for x in collector.spans if x.trace_id == tid and x.kind == "SERVER"]


def test_the_gateways_queue_drops_and_counts_beyond_its_bound_and_never_waits(
        collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    settings = trace.resolve(TelemetrySettings(traces=True), {})
    assert settings is not None
    made = trace.Tracer(settings, {}, exporter=InMemorySpanExporter())
    sent: list[Any] = []
    made.sink.put = sent.append              # type: ignore[method-assign]   (one real finished trace)
    ctx = RequestContext(gen=GenRequest(model="m"))
    made.start(ctx)
    ctx.trace.finish(ctx, time.perf_counter())
    made.shutdown()

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")     # the exporter's processor checks both
    sink = trace_export.ExportProcess(collector.url, 5, "bounded", "0")
    try:
        with sink._send_lock:                # the sender cannot take anything: the queue only fills
            for _ in range(7):
                sink.put(sent[0])
            assert (len(sink.queue), sink.dropped) == (4, 3)
        assert sink.flush(timeout_s=30)
        assert len(sink.queue) == 0 and sink.dropped == 3
    finally:
        sink.shutdown()
    assert sink.proc.poll() is not None


def test_a_trace_with_something_on_it_that_is_not_a_plain_value_is_left_out_not_its_batch() -> None:
    import marshal

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    settings = trace.resolve(TelemetrySettings(traces=True), {})
    assert settings is not None
    made = trace.Tracer(settings, {}, exporter=InMemorySpanExporter())
    sent: list[Any] = []
    made.sink.put = sent.append              # type: ignore[method-assign]
    for bad in (False, True):
        ctx = RequestContext(gen=GenRequest(model="m"))
        made.start(ctx)
        ctx.trace.root.child("cache", attributes={"odd": object()} if bad else None).finish()
        ctx.trace.finish(ctx, time.perf_counter())
    made.shutdown()
    data, left_out = trace_export.dumps(sent)
    [kept] = marshal.loads(data)
    assert left_out == 1 and kept[0] == sent[0][0]           # the good trace, by its id


def test_an_exporter_process_that_died_loses_spans_never_a_request(collector: Collector) -> None:
    with StubServer(Stub()) as s, live_server(upstream_config(s.port, telemetry=traced(collector))) as gw:
        tracer = gw.gateway.tracer
        tracer.sink.proc.kill()
        tracer.sink.proc.wait(30)
        for stream in (False, True):
            r = httpx.post(gw.base_url + "/chat/completions", timeout=30,
                           json={"model": "remote", "messages": HELLO, "max_tokens": 5, "stream": stream})
            assert r.status_code == 200
        wait_until(lambda: tracer.dropped == 2, what="the sender to find the exporter gone and count the traces")
        assert tracer.flush(timeout_s=5) is False

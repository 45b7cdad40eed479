"""A real OTLP/HTTP receiver for the telemetry tests (tests/telemetry/test_trace.py,
tests/telemetry/test_otel_metrics.py): what a collector does with the SDK exporters' requests, decoded with
opentelemetry-proto's message types."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OTLPReceiver:
    """Listens on loopback for POST `path` (/v1/traces, /v1/metrics ...) with a protobuf body (gzip or deflate when
    the exporter compresses) and hands each request, decoded as `message` (ExportTraceServiceRequest,
    ExportMetricsServiceRequest ...), to `receive` on the server's thread; answers 200 with an empty
    Export*ServiceResponse (zero bytes), and 404 to any other path or content type. `posts` counts the requests
    received; subclasses keep what they read under `lock`."""

    def __init__(self, path: str, message: type) -> None:
        self.path, self.message = path, message
        self.posts = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    raw = gzip.decompress(raw)
                elif encoding == "deflate":
                    raw = zlib.decompress(raw)
                if self.path != outer.path or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                outer.receive(outer.message.FromString(raw))
                with outer.lock:
                    outer.posts += 1
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, request: Any) -> None:
        """What the test keeps of one decoded request (nothing here)."""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def value(v: Any) -> Any:
    """An OTLP AnyValue as Python: its str, bool, int, float or bytes, a list for an array, None when unset."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    """OTLP KeyValues (a span's, a resource's, a data point's attributes) as a dict."""
    return {a.key: value(a.value) for a in kvs}

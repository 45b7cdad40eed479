"""OpenTelemetry metrics: the GenAI semantic conventions' model-server histograms and token usage, pushed over
OTLP/HTTP (docs/telemetry.md), beside the Prometheus families of metrics/prometheus.py and metrics/vllm.py.

    gen_ai.server.request.duration        s        every request, arrival to its record; error.type on failure
    gen_ai.server.time_to_first_token     s        successful answers that produced a first token
    gen_ai.server.time_per_output_token   s        successful answers with more than one token per choice
    gen_ai.client.token.usage             {token}  the billed tokens: gen_ai.token.type input | output, per model
                                                   that wrote them (none for a response-cache hit)

Each carries gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model (the name the client asked for) and
gen_ai.response.model (the model that answered); token usage of an upstream's answer also its server.address and
server.port. Model names are the Prometheus labels' (Metrics.label): a name a client made up is `other`.

Off by default: on with `telemetry.metrics: true`, or with `metrics` left null and an OTLP endpoint in the
standard environment variables; OTEL_SDK_DISABLED=true turns it off. Each gateway has its own SDK MeterProvider
(never the process-global one) with a PeriodicExportingMetricReader and the OTLP/HTTP metric exporter: the
reader's thread collects and exports every interval, so a collector that is down loses points, never a request.
The record stage hands each finished request here (`record`), with the times it already computed for Prometheus;
the request path only queues them, the reader's thread measures them. With metrics off nothing of this module
runs beyond `resolve`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from tokenomy.ledger.row import CACHE_HITS
from tokenomy.telemetry.span_attributes import OPERATIONS, error_type

log = logging.getLogger("tokenomy.otel_metrics")

DEFAULT_ENDPOINT = "http://localhost:4318/v1/metrics"
DEFAULT_INTERVAL_S = 60.0      # OTEL_METRIC_EXPORT_INTERVAL's default (60000 ms)

# the conventions' names, units and advised bucket boundaries (gen-ai-metrics.md)
REQUEST_DURATION = "gen_ai.server.request.duration"
TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
TOKEN_USAGE = "gen_ai.client.token.usage"
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)


# ---- settings ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MetricSettings:
    """What the metrics run with, the config file's `telemetry` resolved against the OTEL_* environment."""

    endpoint: str
    interval_s: float
    service_name: str
    timeout_s: float


def resolve(telemetry: Any, env: Mapping[str, str] | None = None) -> MetricSettings | None:
    """The metric settings for a config's `telemetry` section, or None when OTel metrics are off: `metrics: false`,
    OTEL_SDK_DISABLED=true, or `metrics` null and no OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT set (OTEL_METRICS_EXPORTER
    `none` also turns the environment's endpoint off). A value in the file wins over the environment's: the
    endpoint (else the signal's own URL as it is, else the base URL + /v1/metrics), the export interval (else
    OTEL_METRIC_EXPORT_INTERVAL, milliseconds, else 60 s) and the service name (else OTEL_SERVICE_NAME)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or telemetry.metrics is False:
        return None
    metrics_env = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
    base_env = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    exporter_off = env.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none"
    if telemetry.metrics is None and (exporter_off or not (metrics_env or base_env)):
        return None
    endpoint = (telemetry.metrics_endpoint or metrics_env
                or (base_env.rstrip("/") + "/v1/metrics" if base_env else DEFAULT_ENDPOINT))
    interval_s = telemetry.metrics_interval_s or _interval(env)
    return MetricSettings(endpoint=endpoint, interval_s=float(interval_s),
                          service_name=telemetry.service_name or env.get("OTEL_SERVICE_NAME") or "tokenomy",
                          timeout_s=telemetry.timeout_s)


def _interval(env: Mapping[str, str]) -> float:
    raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        ms = float(raw)
    except ValueError:
        ms = 0.0
    if ms <= 0:
        log.warning("OTEL_METRIC_EXPORT_INTERVAL=%s is not a positive number of milliseconds: every %g s", raw,
                    DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S
    return ms / 1000


def servers(models: Any) -> dict[str, tuple[str, int]]:
    """model name -> (server.address, server.port) of the configured models with one upstream (`base_url`); a
    pool's replicas and the embedded engines have none."""
    out = {}
    for m in models:
        url = getattr(m, "base_url", None)
        if url and not getattr(m, "replicas", None):
            where = urlsplit(url)
            if where.hostname:
                out[m.name] = (where.hostname, where.port or (443 if where.scheme == "https" else 80))
    return out


# ---- the instruments ----------------------------------------------------------------------------------------------

class _Facts(NamedTuple):
    """What a finished request's metrics need of it, taken on the request path (model names already labels)."""

    kind: str
    asked: str
    answered: str | None
    error: str | None
    duration_s: float
    ttft_s: float | None           # None: not measured (a failure, or no first token)
    tpot_s: float | None
    tokens: tuple[tuple[str | None, int, int], ...]     # (model, input, output) per model billed


class OtelMetrics:
    """One gateway's GenAI metrics: its own MeterProvider, the four histograms, the model -> provider names
    (telemetry/trace.py's PROVIDERS) and model -> upstream address, and `label` (Metrics.label: the configured names
    as they are, anything else `other`).

    The request path only queues each request's facts (`record`: a tuple); the reader's thread makes them into the
    SDK's measurements just before each collection (`drain`), as the tracer makes its spans on the export thread:
    the SDK's Histogram.record costs some 20-40 us a call on this project's machines and a request makes up to
    six. At most QUEUE requests wait between two collections; beyond, the oldest are dropped."""

    QUEUE = 1 << 18

    def __init__(self, settings: MetricSettings, providers: Mapping[str, str],
                 addresses: Mapping[str, tuple[str, int]] | None = None, label: Any = None,
                 reader: Any = None) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        from tokenomy import __version__

        self.settings = settings
        self.providers = dict(providers)
        self.addresses = dict(addresses or {})
        self.label: Callable[[str | None], str] = label if label is not None else (lambda name: name or "other")
        self.pending: deque[_Facts] = deque(maxlen=self.QUEUE)
        if reader is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=settings.endpoint, timeout=settings.timeout_s),
                export_interval_millis=settings.interval_s * 1000, export_timeout_millis=settings.timeout_s * 1000)
        collect = reader.collect

        def drained(timeout_millis: float = 10_000) -> None:    # every collection: the timer's, a flush, the last
            self.drain()
            collect(timeout_millis=timeout_millis)

        reader.collect = drained
        self.provider = MeterProvider(metric_readers=[reader],
                                      resource=Resource.create({"service.name": settings.service_name}),
                                      shutdown_on_exit=False)        # the gateway's close shuts it down
        meter = self.provider.get_meter("tokenomy", __version__)
        self.duration = meter.create_histogram(
            REQUEST_DURATION, unit="s", explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            description="Generative AI server request duration such as time-to-last byte or last output token.")
        self.ttft = meter.create_histogram(
            TIME_TO_FIRST_TOKEN, unit="s", explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
            description="Time to generate first token for successful responses.")
        self.tpot = meter.create_histogram(
            TIME_PER_OUTPUT_TOKEN, unit="s", explicit_bucket_boundaries_advisory=TPOT_BUCKETS,
            description="Time per output token generated after the first token for successful responses.")
        self.tokens = meter.create_histogram(
            TOKEN_USAGE, unit="{token}", explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            description="Number of input and output tokens used.")
        log.info("OTel metrics go to %s every %g s as service %s", settings.endpoint, settings.interval_s,
                 settings.service_name)

    def record(self, ctx: Any, duration_s: float, tpot_s: float | None) -> None:
        """One finished request: its duration (arrival to its record, in seconds), and, when it succeeded, its
        time to first token (the usage's) and `tpot_s` (the record stage's time per output token, None when it had
        one token per choice or none); the tokens billed for it (gen_ai.client.token.usage: billable tokens, as
        the ledger counts them: none for a response-cache hit, where no model ran; each model's of an answer
        several wrote; the discarded answers of a cascade's escalations). Queued, measured at the next `drain`."""
        u, error, label = ctx.usage, error_type(ctx), self.label
        ok = u is not None and error is None
        used: list[tuple[str | None, Any]] = []
        if u is not None and ctx.cache not in CACHE_HITS:
            used = list(u.parts) if u.parts else [(ctx.model or None, u)]
        tokens = tuple((label(name) if name else None, part.prompt_tokens, part.completion_tokens)
                       for name, part in used + list(ctx.escalations))
        self.pending.append(_Facts(ctx.gen.kind, label(ctx.gen.model), label(ctx.model) if ctx.model else None,
                                   error, duration_s, u.ttft_s if ok else None, tpot_s if ok else None, tokens))

    def drain(self) -> None:
        """Measure the queued requests (on the reader's thread, before each collection)."""
        while True:
            try:
                facts = self.pending.popleft()
            except IndexError:
                return
            try:
                self._measure(facts)
            except Exception:          # one request that cannot be measured is dropped, not the collection
                log.exception("a request's OTel metrics could not be measured")

    def _measure(self, f: _Facts) -> None:
        attrs = {"gen_ai.operation.name": OPERATIONS.get(f.kind, f.kind),
                 "gen_ai.provider.name": self.providers.get(f.answered or "", "tokenomy"),
                 "gen_ai.request.model": f.asked}
        if f.answered is not None:
            attrs["gen_ai.response.model"] = f.answered
        self.duration.record(max(f.duration_s, 0.0), attrs if f.error is None else {**attrs, "error.type": f.error})
        if f.ttft_s is not None:
            self.ttft.record(max(f.ttft_s, 0.0), attrs)
        if f.tpot_s is not None:
            self.tpot.record(max(f.tpot_s, 0.0), attrs)
        for name, prompt, completion in f.tokens:
            by = dict(attrs)
            if name is not None:
                by["gen_ai.response.model"] = name
                by["gen_ai.provider.name"] = self.providers.get(name, "tokenomy")
                if name in self.addresses:
                    by["server.address"], by["server.port"] = self.addresses[name]
            self.tokens.record(prompt, {**by, "gen_ai.token.type": "input"})
            if f.kind != "embedding":
                self.tokens.record(completion, {**by, "gen_ai.token.type": "output"})

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Collect and export now; False when that did not finish within `timeout_s`."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left (bounded by the exporter's timeout) and stop the reader's thread."""
        self.provider.shutdown(timeout_millis=self.settings.timeout_s * 1000 * 2)

"""The file's sections for running the service: `server:`, `ledger:`, `telemetry:`, `energy:` and `batch:`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tokenomy.config.section import Section
from tokenomy.engine import tuning


class EnergySettings(Section):
    """Joules per request, for the ledger's tokens-per-joule (hardware/energy.py)."""

    source: Literal["auto", "nvml", "rapl", "estimate"] = Field(
        "auto", description="nvml (NVIDIA GPUs), rapl (Intel/AMD CPU counters), estimate (busy cores x "
        "watts_per_core), or auto: the first of these that works")
    watts_per_core: float = Field(15.0, gt=0, description="CPU estimate: watts per busy core")


class TelemetrySettings(Section):
    """OpenTelemetry traces and metrics in the GenAI semantic conventions (docs/telemetry.md): a span per request,
    its stages, upstream calls and the engine's queue, prefill and decode; the gen_ai.server.* histograms and
    gen_ai.client.token.usage; both exported over OTLP/HTTP. Every field left null takes the standard OTEL_*
    environment variable; OTEL_SDK_DISABLED=true turns both off whatever the file says."""

    traces: bool | None = Field(None, description="true: trace; false: never; null: trace when "
                                "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT is set")
    endpoint: str | None = Field(None, description="the OTLP/HTTP traces URL (http://collector:4318/v1/traces); "
                                 "null: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + "
                                 "/v1/traces, else http://localhost:4318/v1/traces")
    sample_ratio: float | None = Field(None, ge=0, le=1, description="share of the traces started here that are "
                                       "kept (a caller's traceparent decides for its own); null: "
                                       "$OTEL_TRACES_SAMPLER / $OTEL_TRACES_SAMPLER_ARG, else every trace")
    service_name: str | None = Field(None, description="the spans' service.name; null: $OTEL_SERVICE_NAME, else "
                                     "tokenomy")
    capture_content: bool = Field(False, description="record prompts and answers on the request's span "
                                  "(gen_ai.input.messages, gen_ai.output.messages), and only for tenants whose "
                                  "bodies the ledger keeps (ledger.store_prompts, store_prompts_tenants)")
    metrics: bool | None = Field(None, description="OTel metrics (gen_ai.server.request.duration, "
                                 ".time_to_first_token, .time_per_output_token, gen_ai.client.token.usage): true: "
                                 "export; false: never; null: export when $OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or "
                                 "$OTEL_EXPORTER_OTLP_ENDPOINT is set")
    metrics_endpoint: str | None = Field(None, description="the OTLP/HTTP metrics URL "
                                         "(http://collector:4318/v1/metrics); null: "
                                         "$OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + "
                                         "/v1/metrics, else http://localhost:4318/v1/metrics")
    metrics_interval_s: float | None = Field(None, gt=0, description="seconds between two metric exports; null: "
                                             "$OTEL_METRIC_EXPORT_INTERVAL (milliseconds), else 60")
    timeout_s: float = Field(5.0, gt=0, description="seconds one export to the collector may take (on the "
                             "exporter's own thread, never a request's)")


class LedgerSettings(Section):
    """Where rows go, and whether request bodies and answers are kept beside them (for `tokenomy replay`).
    Bodies are personal data: off by default, per tenant when `store_prompts_tenants` lists them, deleted once
    older than `retention_days` (the rows themselves are kept)."""

    url: str | None = Field(None, description="sqlite:///FILE or postgresql://user@host/db; null: ledger.db in "
                            "the data directory ($TOKENOMY_HOME, else $XDG_DATA_HOME/tokenomy, else "
                            "~/.local/share/tokenomy)")
    store_prompts: bool = Field(False, description="keep request bodies and answers beside the rows")
    store_prompts_tenants: list[str] | None = Field(None, description="only these tenants' bodies; null: every "
                                                    "tenant's (when store_prompts is on)")
    retention_days: float = Field(30.0, gt=0, description="days stored bodies are kept")

    @model_validator(mode="after")
    def _tenants(self) -> LedgerSettings:
        if self.store_prompts_tenants is not None and not self.store_prompts:
            raise ValueError("store_prompts_tenants needs store_prompts: true")
        return self

    def stores_prompts(self, tenant: str) -> bool:
        return self.store_prompts and (self.store_prompts_tenants is None or tenant in self.store_prompts_tenants)


class BatchSettings(Section):
    """The Batch API (docs/batch.md): files and batches live in the ledger's database."""

    enabled: bool = Field(True, description="serve /v1/files and /v1/batches (needs a ledger)")
    concurrency: int = Field(8, ge=1, le=256, description="batch requests in flight at once, all batches together")
    upstream_concurrency: int = Field(2, ge=1, description="batch requests in flight to one upstream model")
    upstream_max_wait_s: float = Field(0.5, ge=0, description="hold batch requests for an upstream model while its "
                                       "expected queue wait (the load signal routing uses) is above this")
    upstream_max_queued: float = Field(0, ge=0, description="hold batch requests for an upstream pool while every "
                                       "replica reports more than this many requests waiting (vLLM's "
                                       "num_requests_waiting and its kin, scraped)")
    max_file_bytes: int = Field(100 << 20, ge=1024, description="the largest file upload, in bytes")
    max_lines: int = Field(50_000, ge=1, description="the most requests (non-empty lines) in one batch's input "
                           "file, as OpenAI's; a file with more is refused (400 too_many_lines) and nothing is "
                           "stored. A line is at most server.max_body_bytes long, as a request body is")
    max_attempts: int = Field(3, ge=1, description="a batch request whose start fails with an unexpected error "
                              "(not a 4xx, not a full queue) is tried this many times, then fails as its line")
    poll_s: float = Field(0.5, gt=0, description="seconds between looks for new batch work when none woke the "
                          "runner")
    drain_s: float = Field(10.0, ge=0, description="at shutdown, how long in-flight batch requests may finish")
    lease_s: float = Field(60.0, gt=0, description="gateways sharing a database: a batch request one of them "
                           "started is its own for this long, renewed while it runs; if that gateway dies, another "
                           "runs the request after this")


class ServerSettings(Section):
    """The HTTP server (`tokenomy serve --host/--port` override these)."""

    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 for every interface")
    port: int = Field(8000, ge=1, le=65535, description="port to bind")
    ollama_port: int | None = Field(None, ge=1, le=65535, description="a second port to serve on, with every API "
                                    "on it, e.g. 11434, Ollama's, where Ollama clients look by default "
                                    "(docs/ollama.md); `tokenomy serve --ollama-port`")
    max_body_bytes: int = Field(4 << 20, ge=1024, description="the largest request body, in bytes (413 above)")
    socket_pin_s: float = Field(300.0, ge=0, le=tuning.PIN_MAX_S, description="a Responses WebSocket's "
                                "conversation keeps its KV pinned in an embedded engine this many seconds after "
                                "each turn, for the next (evicted after every unpinned prefix, so it never refuses "
                                "other work; 0: not pinned; docs/api.md)")
    public: list[str] = Field(default_factory=lambda: ["/health"], description="with keys configured, these paths "
                              "answer without one; /metrics, /docs and /openapi.json need any valid key unless "
                              "listed (a Prometheus scrape can send one as a bearer token)")
    metrics_per_tenant_public: bool = Field(False, description="with keys configured, /metrics shows the families "
                                            "labelled by tenant or key (tokenomy_tenant_*, "
                                            "tokenomy_budget_used_ratio) to every key that may read it; off: "
                                            "to admin keys only")
    workers: int = Field(1, ge=1, le=256, description="API processes on the port, each running the whole pipeline, "
                         "in front of one engine process per loaded embedded model (docs/workers.md); more than 1 "
                         "needs limits.store on Redis when keys or tenants have limits or budgets")

"""Prometheus metrics, grouped by eight layers: hardware, communication, scheduling, engine, model, token, cost and
business (deploy/grafana/tokenomy.json has a row for each). One registry per app (tests run several). Every
metric tokenomy exports is defined here, and the embedded engines' families in vLLM's names in vllm_metrics.py; the
stages and backends that count into one take the `Metrics`.

Several API workers (`server.workers`, server/workers.py) share one exposition through prometheus-client's
multiprocess mode: with PROMETHEUS_MULTIPROC_DIR set before the import, every counter, histogram and gauge
defined here writes to a file per process, and `render` sums them over every worker, the ones that died too (a
counter never goes back). The collectors read at scrape time (engines, caches, limits, ledger, pools, hardware)
show the state of the worker that answers the scrape; the engines' state is the same in every worker."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tokenomy.metrics.vllm import VllmMetrics

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class EngineCollector:
    """Reads live engine state at scrape time (running, waiting, KV usage), so the engine stays unaware of us."""

    def __init__(self, engines: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self._engines = engines

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        running = GaugeMetricFamily("tokenomy_engine_running_seqs", "Sequences in the running batch", labels=["model"])
        kv = GaugeMetricFamily("tokenomy_engine_kv_usage_ratio", "KV cells in use / KV cells", labels=["model"])
        queue = GaugeMetricFamily("tokenomy_queue_depth", "Requests waiting for the engine", labels=["model"])
        up = GaugeMetricFamily("tokenomy_engine_up", "1 while the engine process serves, 0 while it restarts",
                               labels=["model"])
        restarts = CounterMetricFamily("tokenomy_engine_restarts", "Engine processes restarted after a crash or "
                                       "a hang", labels=["model"])
        tier = {attr: (CounterMetricFamily if kind == "c" else GaugeMetricFamily)(
            f"tokenomy_engine_kv_tier_{metric}", text, labels=["model", "tier"])
            for metric, attr, kind, text in TIER_METRICS}
        for name, engine in self._engines():
            stats = getattr(engine, "tier_stats", None)
            for attr, family in tier.items() if stats is not None else ():
                for t, v in getattr(stats, attr).items():
                    family.add_metric([name, t], v)
            running.add_metric([name], engine.running)
            kv.add_metric([name], engine.kv_usage)
            queue.add_metric([name], engine.queue_depth)
            up.add_metric([name], 1.0 if engine.state == "ready" else 0.0)
            restarts.add_metric([name], engine.restarts)
        yield running
        yield kv
        yield queue
        yield up
        yield restarts
        yield from tier.values()


TIER_METRICS = (   # name, TierStats field, counter or gauge, help: KV tiers (engine/kv/tier.py)
    ("saved", "saved", "c", "Evicted prefixes whose KV was saved into the tier"),
    ("hits", "hits", "c", "Prompts whose prefix was restored from the tier"),
    ("restored_tokens", "restored_tokens", "c", "Prompt tokens restored from the tier instead of recomputed"),
    ("restore_seconds", "restore_s", "c", "Seconds spent restoring from the tier (read and load)"),
    ("bytes", "bytes", "g", "Bytes of KV the tier holds"),
    ("entries", "entries", "g", "Prefixes the tier holds"),
)


class FleetCollector:
    """The fleet's models at scrape time (backends/fleet.py): planned and measured bytes, and whether loaded."""

    def __init__(self, ps: Callable[[], dict[str, Any]]) -> None:
        self._ps = ps

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        memory = GaugeMetricFamily("tokenomy_model_memory_bytes", "A model's memory: estimated (weights, KV, KV "
                                   "tier; counted by placement) and measured (its engine's RSS after loading, and "
                                   "on a GPU what NVML says it holds there)",
                                   labels=["model", "kind"])
        loaded = GaugeMetricFamily("tokenomy_model_loaded", "1 while a model is loaded, 0 while it is not",
                                   labels=["model"])
        limit = GaugeMetricFamily("tokenomy_fleet_memory_limit_bytes", "Bytes the fleet places models in")
        ps = self._ps()
        limit.add_metric([], ps["memory_limit_bytes"])
        for m in ps["models"]:
            on = m["state"] == "loaded"
            memory.add_metric([m["name"], "estimated"], m["memory_bytes"] if on else 0)
            if on and m["rss_bytes"] is not None:
                memory.add_metric([m["name"], "measured"], m["rss_bytes"])
            if on and m["vram_measured_bytes"] is not None:
                memory.add_metric([m["name"], "measured_gpu"], m["vram_measured_bytes"])
            loaded.add_metric([m["name"]], 1.0 if on else 0.0)
        yield memory
        yield loaded
        yield limit


class CacheCollector:
    def __init__(self, stores: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self._stores = stores

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        errors = CounterMetricFamily("tokenomy_cache_store_errors", "Failed cache store calls (the request was "
                                     "served uncached)", labels=["cache"])
        up = GaugeMetricFamily("tokenomy_cache_store_up", "1 while the cache store answers", labels=["cache"])
        for name, store in self._stores():
            errors.add_metric([name], store.errors)
            up.add_metric([name], 1.0 if getattr(store, "healthy", True) else 0.0)
        yield errors
        yield up


class PoolCollector:
    """Replicas of pooled models, read at scrape time: load, health, what each served and why it was chosen."""

    def __init__(self, pools: Callable[[], Iterable[Any]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["model", "replica"]
        outstanding = GaugeMetricFamily("tokenomy_replica_outstanding", "Requests this gateway has at the replica",
                                        labels=labels)
        up = GaugeMetricFamily("tokenomy_replica_up", "1 while the replica is eligible (answers its health check, "
                               "not ejected)", labels=labels)
        waiting = GaugeMetricFamily("tokenomy_replica_waiting", "Requests queued at the replica, from its own "
                                    "metrics (scraped)", labels=labels)
        kv = GaugeMetricFamily("tokenomy_replica_kv_usage_ratio", "The replica's KV cache in use (scraped)",
                               labels=labels)
        requests = CounterMetricFamily("tokenomy_replica_requests", "Requests a replica served, by what chose it "
                                       "(prefix | load | session | turn | failover)", labels=labels + ["by"])
        failures = CounterMetricFamily("tokenomy_replica_failures", "Requests a replica failed before its first "
                                       "byte (each went to another replica)", labels=labels)
        now = time.monotonic()
        for pool in self._pools():
            for r in pool.replicas:
                outstanding.add_metric([pool.name, r.name], r.outstanding)
                up.add_metric([pool.name, r.name], 1.0 if r.eligible(now) else 0.0)
                if r.signal.waiting is not None:
                    waiting.add_metric([pool.name, r.name], r.signal.waiting)
                if r.signal.kv_usage is not None:
                    kv.add_metric([pool.name, r.name], r.signal.kv_usage)
                failures.add_metric([pool.name, r.name], r.failed)
            for (name, by), n in sorted(pool.routed.items()):
                requests.add_metric([pool.name, name, by], n)
        yield from (outstanding, up, waiting, kv, requests, failures)


class LimitsCollector:
    """The shared rate-limit and budget store (limits/shared_counters.py): whether it answers, and failed calls."""

    def __init__(self, shared: Any) -> None:
        self.shared = shared

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("tokenomy_limits_store_up", "1 while the shared limits store answers",
                                value=1.0 if self.shared.healthy else 0.0)
        errors = CounterMetricFamily("tokenomy_limits_store_errors", "Failed calls to the shared limits store")
        errors.add_metric([], self.shared.errors)
        yield errors


class HardwareCollector:
    """Hardware layer, read at scrape time from an EnergyMeter: energy (labelled by source: nvml | rapl |
    estimate), power (the source's own reading, else mean power since the previous scrape), memory; and each GPU's
    memory from NVML (tokenomy/hardware/gpu.py), whatever the energy source."""

    def __init__(self, meter: Any) -> None:
        self.meter = meter

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        from tokenomy.hardware.energy import process_rss_bytes

        source = self.meter.source_name
        energy = CounterMetricFamily("tokenomy_hw_energy_joules", "Energy since start; nvml and rapl are measured, "
                                     "estimate is CPU time x watts per core", labels=["source"])
        energy.add_metric([source], self.meter.total_joules())
        yield energy
        power = GaugeMetricFamily("tokenomy_hw_power_watts", "Power draw", labels=["source"])
        watts = self.meter.power_watts()
        if watts is not None:
            power.add_metric([source], watts)
        yield power
        memory = GaugeMetricFamily("tokenomy_hw_memory_bytes", "Memory in use: gpu (NVML) and this process's rss",
                                   labels=["kind"])
        gpu, rss = self.meter.memory_bytes(), process_rss_bytes()
        if gpu is not None:
            memory.add_metric(["gpu"], gpu)
        if rss is not None:
            memory.add_metric(["rss"], rss)
        yield memory
        from tokenomy.hardware import gpu

        used = GaugeMetricFamily("tokenomy_gpu_memory_used_bytes", "GPU memory in use, per GPU (NVML; none without "
                                 "a GPU)", labels=["gpu"])
        total = GaugeMetricFamily("tokenomy_gpu_memory_total_bytes", "GPU memory, per GPU (NVML)", labels=["gpu"])
        for m in gpu.memory() or []:
            used.add_metric([str(m.index)], m.used_bytes)
            total.add_metric([str(m.index)], m.total_bytes)
        yield used
        yield total


class LedgerCollector:
    """The ledger writer's health: rows written, dropped (queue full) and failed (database errors), queued."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        for name, attr, doc in (("tokenomy_ledger_rows_written", "written", "Ledger rows committed"),
                                ("tokenomy_ledger_dropped_rows", "dropped", "Ledger rows dropped: write queue full"),
                                ("tokenomy_ledger_failed_rows", "failed", "Ledger rows the database refused")):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], getattr(self.ledger, attr))
            yield c
        yield GaugeMetricFamily("tokenomy_ledger_queue_depth", "Ledger rows waiting to be written",
                                value=self.ledger.pending)


OTHER = "other"


def forget_process(pid: int, directory: str) -> None:
    """A worker that died: drop its live gauges from the multiprocess files (its counters stay, summed)."""
    from prometheus_client import multiprocess as mp

    mp.mark_process_dead(pid, directory)


def multiprocess() -> bool:
    """Whether this process counts into prometheus-client's multiprocess files (server/workers.py sets the variable
    in each worker before anything imports prometheus_client)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class FleetCounters:
    """The fleet's loads, evictions and load seconds by model (backends/fleet.py): a gateway's, or those of the
    supervisor of `server.workers`, which owns the fleet there and counts into the workers' multiprocess files."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.loads = Counter("tokenomy_model_loads_total", "Models loaded (on demand, asked, or preloaded)",
                             ["model"], registry=registry)
        self.evictions = Counter("tokenomy_model_evictions_total", "Models unloaded to make room for another",
                                 ["model"], registry=registry)
        self.load_seconds = Histogram("tokenomy_model_load_seconds", "Seconds from a load's start to its engine "
                                      "passing its self-check", ["model"], buckets=LATENCY_BUCKETS, registry=registry)

    @classmethod
    def in_files(cls, directory: str) -> FleetCounters:
        """Counters that this process writes into the multiprocess files in `directory`, which the API workers'
        /metrics sum (the supervisor's: server/workers.py). prometheus-client reads PROMETHEUS_MULTIPROC_DIR as it
        makes a value's storage: set here, the class chosen again for the case it was imported before."""
        from prometheus_client import values

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        values.ValueClass = values.get_value_class()
        return cls(CollectorRegistry())


class Metrics:
    def __init__(self) -> None:
        # Configured model and route names: the only values a client's request may put in a label (label()).
        # None: not configured (a Metrics used on its own), every name passes.
        self.names: set[str] | None = None
        self.vllm: VllmMetrics | None = None      # vLLM's families, once there are engines (watch_engines)
        r = self.registry = CollectorRegistry()
        # several workers: what /metrics renders (every worker's counts, and this one's collectors)
        self.shared: CollectorRegistry | None = None
        if multiprocess():
            from prometheus_client.multiprocess import MultiProcessCollector

            self.shared = CollectorRegistry()
            MultiProcessCollector(self.shared)
        # scheduling
        self.queue_wait = Histogram("tokenomy_queue_wait_seconds", "Time from arrival to first schedule",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.rejections = Counter("tokenomy_rejections_total", "Requests refused", ["reason"], registry=r)
        self.prefix_breaks = Counter("tokenomy_prefix_break_total", "Prompts whose prefix reuse broke inside "
                                     "shared content, by the lint's reason", ["reason"], registry=r)
        # engine
        self.batch_tokens = Histogram("tokenomy_engine_batch_tokens", "Tokens per llama_decode step", ["model"],
                                      buckets=BATCH_BUCKETS, registry=r)
        self.preemptions = Counter("tokenomy_engine_preemptions_total", "Sequences preempted for KV", ["model"],
                                   registry=r)
        self.prefix_hits = Counter("tokenomy_engine_prefix_hit_tokens_total", "Prompt tokens reused from the "
                                   "prefix cache", ["model"], registry=r)
        # vLLM's names (vllm:spec_decode_num_drafts and so on)
        self.spec_drafts = Counter("tokenomy_spec_decode_num_drafts_total", "Sequence-steps that verified a draft",
                                   ["model"], registry=r)
        self.spec_draft_tokens = Counter("tokenomy_spec_decode_num_draft_tokens_total", "Tokens drafted",
                                         ["model"], registry=r)
        self.spec_accepted = Counter("tokenomy_spec_decode_num_accepted_tokens_total", "Drafted tokens accepted",
                                     ["model"], registry=r)
        # routing (pipeline/route.py) and token-level routing (router/token_routing.py)
        self.route_decisions = Counter("tokenomy_route_decisions_total", "Routing decisions", ["route", "model", "by"],
                                       registry=r)
        self.route_escalations = Counter("tokenomy_route_escalations_total", "Cascade escalations",
                                         ["route", "from"], registry=r)
        self.token_route_tokens = Counter("tokenomy_token_route_tokens_total", "Answer tokens of token-routed "
                                          "answers by the model that wrote them (counted in the small model's "
                                          "tokens)", ["route", "model"], registry=r)
        self.token_route_handovers = Histogram("tokenomy_token_route_handovers", "Handovers to the large model per "
                                               "answer", ["route"], buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128),
                                               registry=r)
        self.token_route_large_failures = Counter("tokenomy_token_route_large_failures_total", "Token-routed "
                                                  "answers the small model finished alone because the large model "
                                                  "failed", ["route"], registry=r)
        # model
        self.ttft = Histogram("tokenomy_ttft_seconds", "Time to first token", ["model"], buckets=LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("tokenomy_tpot_seconds", "Time per output token after the first", ["model"],
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("tokenomy_e2e_seconds", "End-to-end request time", ["model"],
                             buckets=LATENCY_BUCKETS, registry=r)
        # token
        self.tokens = Counter("tokenomy_tokens_total", "Tokens by kind (prompt, cached, cache_write, "
                              "completion, saved)", ["kind", "model"], registry=r)
        # communication
        self.upstream_latency = Histogram("tokenomy_upstream_request_seconds", "Upstream request latency",
                                          ["backend"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter("tokenomy_upstream_errors_total", "Upstream errors", ["backend", "kind"],
                                       registry=r)
        # cost
        self.schema_cut = Counter("tokenomy_schema_cut_total", "Answers under a JSON response_format that ended at "
                                  "max_tokens inside the JSON", ["model"], registry=r)
        self.schema_invalid = Counter("tokenomy_schema_invalid_total", "Upstream answers that failed their schema",
                                      ["model", "action"], registry=r)
        self.cost = Counter("tokenomy_cost_usd_total", "USD spent", ["model"], registry=r)
        self.tenant_cost = Counter("tokenomy_tenant_cost_usd_total", "USD spent by tenant", ["tenant"], registry=r)
        self.saved = Counter("tokenomy_saved_usd_total", "USD saved", ["by"], registry=r)
        # business
        self.requests = Counter("tokenomy_requests_total", "Requests by outcome and the API called",
                                ["status", "model", "endpoint"], registry=r)
        self.tenant_requests = Counter("tokenomy_tenant_requests_total", "Requests by tenant", ["tenant"],
                                       registry=r)
        self.cache_requests = Counter("tokenomy_cache_requests_total", "Requests by what the response cache did "
                                      "(miss | exact | semantic | bypass)", ["model", "cache"], registry=r)
        self.engine_gauge = Gauge("tokenomy_engine_info", "Embedded engines loaded", ["model"], registry=r,
                                  multiprocess_mode="max")
        self.feedback = Histogram("tokenomy_feedback_score", "Feedback scores (-1 to 1) joined to requests",
                                  buckets=(-1, -0.5, 0, 0.5, 1), registry=r)
        self.budget_used = Gauge("tokenomy_budget_used_ratio", "Share of a spend budget used this period",
                                 ["scope", "id", "period", "unit"], registry=r, multiprocess_mode="mostrecent")
        self.budget_warnings = Counter("tokenomy_budget_warnings_total", "Budgets that crossed their warning "
                                       "threshold", ["scope", "period", "unit"], registry=r)
        # engine: the fleet's loads and evictions (backends/fleet.py)
        self.fleet = FleetCounters(r)
        # hardware: joules attributed to requests (shares of engine steps), by source
        self.request_energy = Counter("tokenomy_request_energy_joules_total", "Energy attributed to requests",
                                      ["model", "source"], registry=r)

    def watch_engines(self, engines: Callable[[], Iterable[tuple[str, Any]]],
                      windows: dict[str, int] | None = None) -> None:
        """The engines' live state as tokenomy_engine_* gauges and, when there are engines (or embedded models that
        load later: `windows`, their windows by name), vLLM's families."""
        self._watch(EngineCollector(engines))
        if windows or any(True for _ in engines()):
            self.vllm = VllmMetrics(self.registry, engines, windows or None)
            for c in self.vllm.collectors:
                if self.shared is not None:
                    self.shared.register(c)

    def watch_fleet(self, ps: Callable[[], dict[str, Any]]) -> None:
        """The fleet's models' memory and state (backends/fleet.py Fleet.ps)."""
        self._watch(FleetCollector(ps))

    def watch_caches(self, stores: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        """Response-cache store health: errors and whether each store answers (a dead Redis is never silent)."""
        self._watch(CacheCollector(stores))

    def watch_pools(self, pools: Callable[[], Iterable[Any]]) -> None:
        """Per-replica figures of pooled models (backends/pool.py)."""
        self._watch(PoolCollector(pools))

    def watch_limits(self, shared: Any) -> None:
        self._watch(LimitsCollector(shared))

    def watch_hardware(self, meter: Any) -> None:
        """Export the hardware layer from an energy.EnergyMeter."""
        self._watch(HardwareCollector(meter))

    def watch_ledger(self, ledger: Any) -> None:
        self._watch(LedgerCollector(ledger))

    def _watch(self, collector: Any) -> None:
        self.registry.register(collector)
        if self.shared is not None:
            self.shared.register(collector)

    def label(self, name: str | None) -> str:
        """A model or route name as a label value: a configured name as it is, anything else (a name a client
        made up, or one that cannot be encoded) as "other", so no request can grow or break the exposition."""
        if not name:
            return OTHER
        return name if self.names is None or name in self.names else OTHER

    def render(self, per_tenant: bool = True) -> bytes:
        """The exposition; without `per_tenant`, less the families labelled by tenant or key (PER_TENANT), which
        only an admin key sees (api/app.py metrics, docs/metrics.md)."""
        text = generate_latest(self.shared if self.shared is not None else self.registry)
        if per_tenant:
            return text
        return b"".join(line for line in text.splitlines(keepends=True) if not _per_tenant(line))


# the families that name a tenant or a key in their labels: what one tenant spends is not another's to read
PER_TENANT = (b"tokenomy_tenant_cost_usd", b"tokenomy_tenant_requests", b"tokenomy_budget_used_ratio")


def _per_tenant(line: bytes) -> bool:
    name = line.split(b" ", 3)[2] if line.startswith(b"# ") else line.split(b"{", 1)[0].split(b" ", 1)[0]
    return name.startswith(PER_TENANT)

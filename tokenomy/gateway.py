"""The composition root: config -> backends, limits, ledger, metrics and the pipeline (build_parts), and the swap of
the reloadable parts (Gateway.reload). The API layer only talks to this."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenomy.backends.base import EmbeddingBackend
from tokenomy.backends.deployments import Registry
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.backends.embedded_launch import engine_settings, preloads, sized_alone, token_routed
from tokenomy.backends.fleet import Fleet, FleetModel, default_placement
from tokenomy.config import (
    AnthropicModelSpec,
    Config,
    ConfigError,
    EmbeddedModelSpec,
    ModelSpec,
    RouteSpec,
    load_config,
)
from tokenomy.config.home import data_dir
from tokenomy.context.tokens import TokenCount
from tokenomy.engine.client import EngineAddress, EngineClient
from tokenomy.engine.launch import Launched
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest, Usage
from tokenomy.hardware.energy import EnergyAccount, EnergyMeter, detect
from tokenomy.ledger import pricing
from tokenomy.ledger.conversations_store import ConversationStore
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.pricing import PriceLike
from tokenomy.ledger.responses_store import ResponseStore
from tokenomy.limits.budget import Budgets
from tokenomy.limits.key_store import KeyStore, Snapshot, keyring_of, stored_budgets
from tokenomy.limits.keys import Keyring, key_id_of
from tokenomy.limits.rate_windows import RateWindows
from tokenomy.limits.shared_counters import SharedCounters
from tokenomy.metrics.prometheus import Metrics
from tokenomy.models.catalog import PACKAGED_EMBEDDINGS
from tokenomy.models.memory import DoesNotFit, Fit
from tokenomy.pipeline.admit import Admit
from tokenomy.pipeline.cache import Cache
from tokenomy.pipeline.chain import Pipeline
from tokenomy.pipeline.context import Context
from tokenomy.pipeline.embed import Embed
from tokenomy.pipeline.generate import Generate
from tokenomy.pipeline.record import Record
from tokenomy.pipeline.request import RequestContext
from tokenomy.pipeline.reserve import Reserve
from tokenomy.pipeline.route import Route
from tokenomy.pipeline.sink import MeterSink
from tokenomy.telemetry import otel_metrics, trace

if TYPE_CHECKING:        # imported where they are built, on first use
    from tokenomy.backends.pool import Pool
    from tokenomy.batch.database import BatchStore
    from tokenomy.batch.worker import BatchRunner
    from tokenomy.cache.exact import ExactCache
    from tokenomy.cache.semantic import SemanticCache

log = logging.getLogger("tokenomy")


def build_backend(spec: ModelSpec, config: Config, *, metrics: Metrics | None = None,
                  n_threads: int | None = None, fits: dict[str, Fit] | None = None,
                  engines: dict[str, EngineAddress] | None = None, launched: dict[str, Launched] | None = None,
                  wait: bool = True, fleet: Fleet | None = None) -> Any:
    """The backend for one configured model: the embedded engine (started here with engine_settings, or the one
    at ``engines[name]`` that a supervisor runs: server/workers.py, or the one launched for it before the gateway was
    built: ``launched[name]``, embedded_launch.py), the OpenAI-compatible upstream (a pool of them
    with `replicas`) or the Messages upstream. Raises ConfigError for what only shows at start (a key's variable
    unset), DoesNotFit for a model memory cannot hold. Without `wait` an embedded engine is left starting: its
    backend's engine.wait_ready() finishes the start. With a `fleet` (and no supervisor's engine), an embedded model
    is the fleet's: loaded now when it preloads, else on its first request (backends/fleet.py)."""
    if isinstance(spec, EmbeddedModelSpec) and fleet is not None and spec.name not in (engines or {}) \
            and spec.name not in token_routed(config):
        return fleet_member(spec, config, fleet, fits, launched)
    if isinstance(spec, EmbeddedModelSpec):
        remote = (engines or {}).get(spec.name)
        if remote is not None:
            if fits is not None:
                fits[spec.name] = remote.fit
            return EmbeddedBackend(spec.name, remote.path, remote.cfg, structured=spec.structured,
                                   address=remote.address, wait=wait)
        early = (launched or {}).pop(spec.name, None)
        if early is not None:
            if fits is not None:
                fits[spec.name] = early.fit
            return EmbeddedBackend(spec.name, early.path, early.cfg, structured=spec.structured,
                                   launched=early.launch, wait=wait)
        path, cfg = engine_settings(spec, config, n_threads=n_threads, fits=fits)
        return EmbeddedBackend(spec.name, path, cfg, structured=spec.structured, wait=wait)
    if isinstance(spec, AnthropicModelSpec):
        from tokenomy.backends.anthropic import AnthropicBackend

        return AnthropicBackend(spec, metrics=metrics)
    if spec.replicas:
        from tokenomy.backends.pool import Pool

        return Pool(spec, metrics=metrics)
    from tokenomy.backends.openai import OpenAIBackend

    return OpenAIBackend(spec, metrics=metrics)


def fleet_member(spec: EmbeddedModelSpec, config: Config, fleet: Fleet, fits: dict[str, Fit] | None,
                 launched: dict[str, Launched] | None) -> FleetModel | None:
    """`spec` made available in `fleet`, sized alone (placement weighs it against the others when it loads); a
    preloaded model's engine is started now (or taken over from `launched`) and finishes in Fleet.start or
    Gateway.wait_ready. None for a discovered model memory cannot hold at all (logged). A model the fleet has
    already (the supervisor's, server.workers) is that member."""
    if spec.name in fleet.models:
        if fits is not None:
            fits[spec.name] = fleet.models[spec.name].fit
        return fleet.models[spec.name]
    early = (launched or {}).pop(spec.name, None)
    if early is not None:
        path, cfg, fit = early.path, early.cfg, early.fit
    else:
        settings = sized_alone(spec, config)
        if settings is None:
            return None
        path, cfg, fit = settings
    if fits is not None:
        fits[spec.name] = fit
    member = fleet.add(spec, path, cfg, fit, lambda: EmbeddedBackend(spec.name, path, cfg, structured=spec.structured))
    if early is not None or preloads(config, spec):
        fleet.preload(member, EmbeddedBackend(spec.name, path, cfg, structured=spec.structured, wait=False,
                                              launched=early.launch if early is not None else None))
    return member


@dataclass(frozen=True)
class Running:
    """What runs for a gateway's whole life, built once from the config it starts with and kept by every reload: the
    backends (loaded models) and their registry, metrics, the ledger, energy accounts, the limits' state (the shared
    counters, the budgets with their spend and holds, the keys' rate windows), the response caches, the embedders,
    the stages that hold no reloadable setting (cache, reserve with its holds' renewal, generate), tracing, the Batch
    API's store and worker and the Responses store. Settings of these (limits.*, cache.*, telemetry.*, batch.*,
    energy.*) take a restart, as models do."""

    metrics: Metrics
    registry: Registry
    fleet: Fleet | None                    # the embedded models, loaded on demand (a FleetProxy under server.workers)
    fits: dict[str, Fit]                   # each embedded model's window and bytes, checked before it loads
    packaged_embedders: list[str]          # the packaged embedding models no configured name shadows
    prices: dict[str, PriceLike]
    ledger: Ledger | None
    energy_meter: EnergyMeter
    energy: EnergyAccount
    shared: SharedCounters | None
    budgets: Budgets
    windows: RateWindows
    exact_cache: ExactCache | None
    semantic_cache: SemanticCache | None
    embedders: dict[str, EmbeddingBackend]
    tracer: trace.Tracer | None
    otel_metrics: otel_metrics.OtelMetrics | None
    cache: Cache
    reserve: Reserve
    generate: Generate
    batches: BatchStore | None
    batch_runner: BatchRunner | None
    responses: ResponseStore | None
    conversations: ConversationStore | None
    key_store: KeyStore | None             # keys and tenants in the ledger's database (the admin API's)
    left_out: frozenset[str] = frozenset()  # models found by fleet.discover that memory cannot hold: not served


@dataclass(frozen=True)
class Parts:
    """What a gateway is made of, built from one Config by `build_parts`. A reload builds the next Parts from the new
    file and swaps the whole of it in one assignment (Gateway.reload): the config, the keyring, the routes, the
    meter's sink (which bodies it stores) and the stages and chains that read them (admit, context, route, embed,
    record) are new; `running` is the one before (context and route share their state with the ones before:
    prefix tracker, summaries, compressors, classifiers, token routers). A request runs on the parts it started
    with (Gateway.handle), so one in flight during a reload ends on them."""

    config: Config
    running: Running
    keyring: Keyring
    routes: dict[str, RouteSpec]
    admit: Admit
    context: Context
    route: Route
    meter: MeterSink
    record: Record
    pipeline: Pipeline
    embed_pipeline: Pipeline
    stored: Snapshot | None = None          # the database's keys and tenants the keyring holds (None: no ledger)


def build_parts(config: Config, gateway: Gateway, before: Parts | None = None, *,
                engines: dict[str, EngineAddress] | None = None, launched: dict[str, Launched] | None = None,
                fleet: Fleet | None = None, stored: Snapshot | None = None) -> Parts:
    """Every part of `gateway` from `config`: the Running ones from `before` when given (a reload), else built (the
    engine processes then load their models while the rest is built: `engines`, `launched`: build_backend; `fleet`:
    the supervisor's, under server.workers, else one is made here). The
    stages call back into `gateway` for what reads its current parts (token counts, prices, windows, summaries).
    The keyring holds the config's keys and those of `stored` (else of a snapshot of the key store taken here)."""
    run = before.running if before is not None else _running(config, gateway, engines, launched, fleet)
    config = served(config, run.left_out)
    if stored is None and run.key_store is not None:
        stored = run.key_store.snapshot()
    keyring = keyring_of(config.keys, config.tenants, stored)
    routes = dict(config.routes)
    led = config.ledger
    meter = MeterSink(run.ledger, run.prices, run.metrics, run.budgets, run.energy,
                      {m.name: m.backend for m in config.models},
                      store_prompts=led.stores_prompts if led is not None and led.store_prompts else None)
    admit = Admit(keyring, run.windows)
    durable = gateway.commit_ledger if run.ledger is not None and config.ledger_durable else None
    # Record wraps the whole chain so that it runs last, for every request, errors and early endings too; its
    # sinks settle what the reserve stage held (budgets and tpm)
    record = Record(run.metrics, sinks=[admit.on_record, meter, run.reserve.on_record], durable=durable,
                    tracer=run.tracer, otel=run.otel_metrics)
    if before is not None:
        context = before.context.with_routes(routes)
        route = before.route.with_routes(routes, [m.name for m in config.models])
    else:
        context = Context(gateway.count_tokens, routes, summarize=gateway.summarize, input_price=gateway.input_price,
                          window=gateway.window,
                          on_break=lambda reason: run.metrics.prefix_breaks.labels(reason).inc())
        route = Route([m.name for m in config.models], routes,
                      expected_wait=lambda name: run.registry.get(name).expected_wait_s(),
                      metrics=run.metrics, backends=run.registry, embedding_models=run.packaged_embedders)
    pipeline = Pipeline([record, admit, context, run.cache, route, run.reserve, run.generate])
    # Embeddings: keys, limits, budgets and the ledger as for a generation; nothing of context, cache or route
    embed = Embed(run.embedders, run.registry, [m.name for m in config.models], routes)
    return Parts(config, run, keyring, routes, admit, context, route, meter, record, pipeline,
                 Pipeline([record, admit, run.reserve, embed]), stored)


def _running(config: Config, gateway: Gateway, engines: dict[str, EngineAddress] | None,
             launched: dict[str, Launched] | None, fleet: Fleet | None) -> Running:
    metrics = Metrics()
    # the packaged embedding models a configured model or route does not shadow: served without config
    packaged = [n for n in PACKAGED_EMBEDDINGS if n not in {m.name for m in config.models} and n not in config.routes]
    metrics.names = model_names(config, packaged)
    registry = Registry(config.cooldown.failures, config.cooldown.window_s, config.cooldown.cooldown_s)
    for spec in config.models:      # a missing upstream key stops the start before any model loads
        if isinstance(spec, AnthropicModelSpec):
            spec.api_key()
    fits: dict[str, Fit] = {}
    left_out: set[str] = set()
    if fleet is None and engines is None:
        fleet = Fleet(config, default_placement(config), metrics.fleet,
                      kv_dir=data_dir() / "fleet-kv" if config.fleet.keep_conversations else None)
    for spec in config.models:
        backend = build_backend(spec, config, metrics=metrics, fits=fits, engines=engines, launched=launched,
                                wait=False, fleet=fleet)
        if backend is not None:     # None: a discovered model that does not fit (fleet_member)
            registry.add(backend)
        else:
            left_out.add(spec.name)
    metrics.watch_engines(lambda: engines_of(registry),
                          {**{n: e.max_model_len for n, e in engines_of(registry)},
                           **{n: m.fit.window for n, m in fleet.models.items()}} if fleet is not None else None)
    metrics.watch_pools(lambda: pools_of(registry))
    if fleet is not None:
        metrics.watch_fleet(fleet.ps)
    led = config.ledger
    ledger = Ledger(led.url, prompt_retention_s=led.retention_days * 86400) if led else None
    key_store = KeyStore(ledger.engine) if ledger is not None else None
    stored = key_store.snapshot() if key_store is not None else None
    e = config.energy
    energy_meter = EnergyMeter(detect(e.watts_per_core, prefer=None if e.source == "auto" else e.source))
    energy = EnergyAccount(energy_meter)
    metrics.watch_hardware(energy_meter)
    if ledger is not None:
        metrics.watch_ledger(ledger)

    def watch(name: str, engine: EngineClient) -> None:    # each engine as it loads
        watch_engine(metrics, name, engine)
        engine.stats.on_step_seqs.append(energy.on_step)

    for name, engine in engines_of(registry):
        watch(name, engine)
    if fleet is not None:
        fleet.on_loaded.append(watch)
    lim = config.limits
    shared = SharedCounters(lim.store, timeout_s=lim.timeout_s) if lim.store != "local" else None
    budgets = Budgets(**budget_limits(config, keyring_of(config.keys, config.tenants, stored), stored),
                      metrics=metrics, shared=shared,
                      fail_open=lim.budgets_on_store_down == "open", lease_s=lim.lease_s,
                      allowances=lim.allowances)
    if ledger is not None:
        budgets.seed(ledger)
    if shared is not None:
        metrics.watch_limits(shared)
        shared.on_recover.append(budgets.reseed)
    windows = RateWindows(shared, fail_open=lim.rates_on_store_down == "open", lease_s=lim.lease_s)
    exact, semantic = _caches(config, gateway.worker)
    metrics.watch_caches(lambda: cache_stores(exact, semantic))
    c = config.cache
    cache = Cache(exact, semantic, gateway.cost, set(c.semantic.routes) if c.semantic.routes is not None else None,
                  deterministic_only=c.exact.deterministic_only)
    # budgets and tpm: the worst case held before a backend sees the request; the record's sinks settle it
    defaults = {m.name: m.defaults.params() for m in config.models if m.defaults is not None}
    reserve = Reserve(budgets, windows, gateway.price, gateway.window, lim,
                      {n: d["max_tokens"] for n, d in defaults.items() if "max_tokens" in d})
    generate = Generate(registry, {m.name: m.schema_policy for m in config.models if m.backend != "embedded"}, metrics,
                        defaults, gateway.window)
    batches, runner = _batch(config, gateway, ledger)
    responses = ResponseStore(ledger.engine, ledger.prompt_retention_s) if ledger is not None else None
    conversations = ConversationStore(ledger.engine, ledger.prompt_retention_s) if ledger is not None else None
    return Running(metrics, registry, fleet, fits, packaged, config.prices(), ledger, energy_meter, energy, shared,
                   budgets, windows, exact, semantic, _embedders(config, registry, packaged), _tracer(config, gateway),
                   _otel_metrics(config, metrics), cache, reserve, generate, batches, runner, responses, conversations,
                   key_store, frozenset(left_out))


def served(config: Config, left_out: frozenset[str]) -> Config:
    """`config` without the models left out at start (found by fleet.discover, too large for memory): not listed,
    and a request for one is a 404 like any unknown name's."""
    if not left_out:
        return config
    return config.model_copy(update={"models": [m for m in config.models if m.name not in left_out]})


def model_names(config: Config, packaged: list[str]) -> set[str]:
    """The names a request may put in a metric's label: configured models, routes, packaged embedding models."""
    return {m.name for m in config.models} | set(config.routes) | set(packaged)


def budget_limits(config: Config, keyring: Keyring, stored: Snapshot | None = None) -> dict[str, Any]:
    """The budgets' limits of a config and the key store's snapshot (the config's win for a tenant in both):
    Budgets' (and Budgets.set_limits') keys, tenants and key_names."""
    keys, tenants = stored_budgets(stored)
    return {"keys": {**keys, **{key_id_of(k): k.budget for k in config.keys if k.budget}},
            "tenants": {**tenants, **{t: s.budget for t, s in config.tenants.items() if s.budget}},
            "key_names": keyring.names()}


def engines_of(registry: Registry) -> list[tuple[str, EngineClient]]:
    """The embedded engines running now (a fleet's loaded models, a supervisor's engines)."""
    out: list[tuple[str, EngineClient]] = []
    for n, b in registry.backends.items():
        engine = b.engine if isinstance(b, (EmbeddedBackend, FleetModel)) else None
        if engine is not None:
            out.append((n, engine))
    return out


def pools_of(registry: Registry) -> list[Pool]:
    from tokenomy.backends.pool import Pool

    return [b for b in registry.backends.values() if isinstance(b, Pool)]


def cache_stores(exact: ExactCache | None, semantic: SemanticCache | None) -> list[tuple[str, Any]]:
    return [(name, c.store) for name, c in (("exact", exact), ("semantic", semantic)) if c is not None]


def _tracer(config: Config, gateway: Gateway) -> trace.Tracer | None:
    """The request tracer (telemetry/trace.py); None when tracing is off. Prompts and answers go on spans only
    with telemetry.capture_content, and for the tenants whose bodies the ledger keeps (read at each request,
    so a reload's store_prompts applies)."""
    settings = trace.resolve(config.telemetry)
    if settings is None:
        return None

    def content(tenant: str) -> bool:
        store = gateway.meter.store_prompts
        return store is not None and store(tenant)

    return trace.Tracer(settings, {m.name: trace.PROVIDERS.get(m.backend, m.backend) for m in config.models},
                        content=content)


def _otel_metrics(config: Config, metrics: Metrics) -> otel_metrics.OtelMetrics | None:
    """The GenAI OTel metrics (telemetry/otel_metrics.py); None when they are off. Model names as the Prometheus
    labels have them (a reload's names apply)."""
    settings = otel_metrics.resolve(config.telemetry)
    if settings is None:
        return None
    return otel_metrics.OtelMetrics(
        settings, {m.name: trace.PROVIDERS.get(m.backend, m.backend) for m in config.models},
        otel_metrics.servers(config.models), label=metrics.label)


def _embedders(config: Config, registry: Registry, packaged: list[str]) -> dict[str, EmbeddingBackend]:
    """The embedding models by name: every OpenAI-compatible upstream (its /embeddings), then the packaged
    MiniLM on the semantic cache's embedder."""
    from tokenomy.backends.minilm import MiniLMBackend

    out: dict[str, Any] = {m.name: registry.get(m.name) for m in config.models if m.backend == "openai"}
    for name in packaged:
        out[name] = MiniLMBackend(name, PACKAGED_EMBEDDINGS[name].dimensions,
                                  threads=config.cache.semantic.embed_threads)
    return out


def _batch(config: Config, gateway: Gateway, ledger: Ledger | None) -> tuple[BatchStore | None, BatchRunner | None]:
    """The Batch API's store (in the ledger's database) and its worker; (None, None) without a ledger."""
    if ledger is None or not config.batch.enabled:
        return None, None
    from tokenomy.batch.database import BatchStore
    from tokenomy.batch.worker import BatchRunner

    b = config.batch
    store = BatchStore(ledger.engine)
    runner = BatchRunner(store, gateway.handle, concurrency=b.concurrency, poll_s=b.poll_s, drain_s=b.drain_s,
                         flush=ledger.flush, upstream=lambda m: bool(gateway.upstreams(m)),
                         hold=gateway.hold_batch, upstream_concurrency=b.upstream_concurrency, lease_s=b.lease_s,
                         max_attempts=b.max_attempts)
    return store, runner


def _caches(config: Config, worker: int | None) -> tuple[ExactCache | None, SemanticCache | None]:
    from tokenomy.cache.exact import ExactCache
    from tokenomy.cache.semantic import SemanticCache
    from tokenomy.cache.store import RedisStore, SQLiteStore

    c = config.cache
    path = c.directory()
    if c.exact.enabled or c.semantic.enabled:
        path.mkdir(parents=True, exist_ok=True)

    def store(namespace: str, max_entries: int) -> Any:
        if c.store == "local":
            return SQLiteStore(str(path / f"{namespace}.sqlite"), namespace, max_entries)
        return RedisStore(c.store, namespace, max_entries)

    exact = semantic = None
    if c.exact.enabled:
        exact = ExactCache(store("exact", c.exact.max_entries), ttl_s=c.exact.ttl_s,
                           max_entries=c.exact.max_entries, deterministic_only=c.exact.deterministic_only)
    if c.semantic.enabled:
        s = c.semantic
        # each worker's index is its own (a Redis store's log shares entries between them: cache/replication.py)
        index = path / ("semantic" if not worker else f"semantic-worker{worker}")
        semantic = SemanticCache(index, store=store("semantic", s.max_entries),
                                 threshold=s.threshold, error_budget=s.error_budget, ttl_s=s.ttl_s,
                                 max_entries=s.max_entries, embed_threads=s.embed_threads,
                                 min_margin=s.min_margin, explore=s.explore,
                                 explore_window=s.explore_window)
        semantic.warm()
    return exact, semantic


def watch_engine(m: Metrics, name: str, engine: EngineClient) -> None:
    """Count an engine's steps in the metrics: batch sizes, preemptions, prefix hits, speculation."""
    batch, pre, hits = m.batch_tokens.labels(name), m.preemptions.labels(name), m.prefix_hits.labels(name)
    spec = (m.spec_drafts.labels(name), m.spec_draft_tokens.labels(name), m.spec_accepted.labels(name))
    # from the counters so far: an API worker that joins a running engine counts only what comes after
    last = (engine.preemptions, engine.prefix_hit_tokens, engine.prefix_query_tokens, *engine.spec)

    def on_step(n_tokens: int, n_seqs: int, dt: float) -> None:
        nonlocal last
        now = (engine.preemptions, engine.prefix_hit_tokens, engine.prefix_query_tokens, *engine.spec)
        # what the engine's counters grew by (they restart with a restarted engine)
        d_pre, d_hits, d_queries, *d_spec = (max(new - old, 0) for new, old in zip(now, last, strict=True))
        last = now
        if not engine.owns_steps:     # another API worker counts this engine's steps (server/workers.py)
            return
        batch.observe(n_tokens)
        pre.inc(d_pre)
        hits.inc(d_hits)
        for counter, d in zip(spec, d_spec, strict=True):
            counter.inc(d)
        if m.vllm is not None:
            m.vllm.step(name, n_tokens, d_pre, d_queries, d_hits, (d_spec[0], d_spec[1], d_spec[2]))

    engine.stats.on_step.append(on_step)


KEYS_POLL_S = 0.5       # how often each gateway asks the key store's version (docs/admin.md: live within a second)


class Gateway:
    def __init__(self, config: Config, config_path: str | None = None, models: list[str] | None = None,
                 engines: dict[str, EngineAddress] | None = None, worker: int | None = None,
                 wait: bool = True, launched: dict[str, Launched] | None = None, fleet: Fleet | None = None) -> None:
        """Start every model and build the pipeline (build_parts). The engine processes load their models while the
        rest is built (the semantic cache's embedder among it); `wait`: return once they have passed their
        self-checks (raising EngineStartError for one that failed), else the caller calls wait_ready() before
        serving. `engines`, `fleet` and `worker`: an API worker of `server.workers` (server/workers.py) uses the engine
        processes of token routes and the fleet (a FleetProxy: backends/fleet_proxy.py) that its supervisor runs, and
        keeps its semantic index apart from the other workers'. `launched`: engine
        processes started before the gateway (embedded_launch.launch_engines), taken over (and taken out of the
        dict) by the embedded backends of their models."""
        self.worker = worker
        self.config_path = config_path
        self.cli_models = models or []      # named on the command line: a reload keeps them
        self.added: list[EmbeddedModelSpec] = []    # added while serving (add_model): a reload keeps them too
        self.keys_poll_s = KEYS_POLL_S
        self._keys_lock = threading.Lock()      # one swap of the keyring at a time, never to an older version
        self._keys_watch: asyncio.Task[None] | None = None
        self.parts = build_parts(config, self, engines=engines, launched=launched, fleet=fleet)
        if wait:
            self.wait_ready()

    # ---- the parts by name (the current ones: a reload swaps them) ------------------------------------------------
    @property
    def config(self) -> Config:
        return self.parts.config

    @property
    def keyring(self) -> Keyring:
        return self.parts.keyring

    @property
    def routes(self) -> dict[str, RouteSpec]:
        return self.parts.routes

    @property
    def pipeline(self) -> Pipeline:
        return self.parts.pipeline

    @property
    def record(self) -> Record:
        return self.parts.record

    @property
    def meter(self) -> MeterSink:
        return self.parts.meter

    @property
    def metrics(self) -> Metrics:
        return self.parts.running.metrics

    @property
    def registry(self) -> Registry:
        return self.parts.running.registry

    @property
    def ledger(self) -> Ledger | None:
        return self.parts.running.ledger

    @property
    def budgets(self) -> Budgets:
        return self.parts.running.budgets

    @property
    def reserve(self) -> Reserve:
        return self.parts.running.reserve

    @property
    def exact_cache(self) -> ExactCache | None:
        return self.parts.running.exact_cache

    @property
    def embedders(self) -> dict[str, EmbeddingBackend]:
        return self.parts.running.embedders

    @property
    def packaged_embedders(self) -> list[str]:
        return self.parts.running.packaged_embedders

    @property
    def tracer(self) -> trace.Tracer | None:
        return self.parts.running.tracer

    @property
    def otel_metrics(self) -> otel_metrics.OtelMetrics | None:
        return self.parts.running.otel_metrics

    @property
    def batches(self) -> BatchStore | None:
        return self.parts.running.batches

    @property
    def batch_runner(self) -> BatchRunner | None:
        return self.parts.running.batch_runner

    @property
    def responses(self) -> ResponseStore | None:
        return self.parts.running.responses

    @property
    def conversations(self) -> ConversationStore | None:
        return self.parts.running.conversations

    def wait_ready(self) -> None:
        """Wait for every embedded engine to pass its start-up self-check (EngineStartError for one that failed):
        the preloaded models of the fleet, or a supervisor's engines."""
        fleet = self.parts.running.fleet
        if fleet is not None:
            fleet.wait_preloads()
        for _, engine in self.engines():
            engine.wait_ready()

    def hold_batch(self, model: str) -> bool:
        """Whether batch work for `model` should wait: an upstream it may go to expects a queue wait above
        batch.upstream_max_wait_s, or (a pool) every replica publishes more than batch.upstream_max_queued waiting."""
        b = self.config.batch
        for name in self.upstreams(model):
            backend = self.registry.get(name)
            queued = backend.queued()
            if backend.expected_wait_s() > b.upstream_max_wait_s or (queued is not None
                                                                     and queued > b.upstream_max_queued):
                return True
        return False

    def upstreams(self, name: str) -> list[str]:
        """The upstream (openai and anthropic backend) models a model or route name may be served by."""
        names = self.routes[name].models if name in self.routes else [name]
        return [m.name for m in self.config.models if m.name in names and m.backend != "embedded"]

    async def commit_ledger(self) -> None:
        """Wait, off the event loop, until every ledger row written so far is committed (ledger_durable)."""
        ledger = self.ledger
        assert ledger is not None
        await asyncio.to_thread(ledger.flush)

    def cache_stores(self) -> list[tuple[str, Any]]:
        return cache_stores(self.parts.running.exact_cache, self.parts.running.semantic_cache)

    def price(self, model: str, batch: bool = False) -> PriceLike | None:
        """A configured model's price (by its name, else its gguf: Config.prices) for one request, the batch price
        for a batch request (meter.pricing.price_of); None for a model not configured."""
        return pricing.price_of(self.parts.running.prices, model, batch)

    def cost(self, model: str, usage: Usage, batch: bool = False) -> float:
        """USD for a generation: uncached input, cached input, cache writes and output each at their own price."""
        p = self.price(model, batch)
        return 0.0 if p is None else pricing.usage_cost(p, usage).total_usd

    def engines(self) -> list[tuple[str, EngineClient]]:
        return engines_of(self.registry)

    async def summarize(self, model: str, text: str, max_tokens: int, batch: bool = False) -> tuple[str, float]:
        """A summary of `text` by `model` (compaction's summary model), and what it cost in USD (at the batch price
        for a batch request's summary)."""
        from tokenomy.context.compaction import SUMMARY_PROMPT
        from tokenomy.pipeline.request import new_request_id

        req = GenRequest(model=model, messages=[{"role": "system", "content": SUMMARY_PROMPT},
                                                {"role": "user", "content": text}],
                         params={"max_tokens": max_tokens, "temperature": 0.0}, request_id=new_request_id(),
                         stream=False)
        parts, usage = [], None
        try:
            async for d in self.registry.get(model).stream(req):
                if d.error:
                    raise RuntimeError(d.error)
                parts.append(d.text)
                usage = d.usage or usage
        finally:
            self.parts.running.energy.pop(req.request_id)      # no row of its own: charged to the request it compacts
        return "".join(parts), self.cost(model, usage, batch) if usage is not None else 0.0

    def input_price(self, model: str, batch: bool = False) -> tuple[float, bool]:
        """USD per input token of a configured model (or a packaged model by name), and whether it is notional."""
        from tokenomy.models.catalog import PACKAGED

        p = self.price(model, batch)
        if p is not None:
            return p.input / 1e6, p.notional
        if model in PACKAGED:
            return PACKAGED[model].price_input / 1e6, True
        return 0.0, True

    def window(self, model: str) -> int | None:
        """A configured model's context window in tokens: an embedded engine's max_model_len; None for an upstream
        (its server enforces its own) or an engine not yet started."""
        backend = self.registry.backends.get(model)
        if isinstance(backend, FleetModel):
            engine = backend.engine
            return engine.max_model_len if engine is not None else backend.fit.window
        if isinstance(backend, EmbeddedBackend):
            return backend.engine.max_model_len or None
        return None

    def window_source(self, model: str) -> dict[str, Any]:
        """`/v1/models` fields of an embedded model: its context window and where it came from (gguf: the trained
        context; memory: that cut to what memory holds; config: engine.n_ctx / max_model_len); {} otherwise."""
        fit, window = self.parts.running.fits.get(model), self.window(model)
        if fit is None or window is None:
            return {}
        backend = self.registry.backends.get(model)
        fleet = ({"state": backend.state, "memory_bytes": backend.memory_bytes} if isinstance(backend, FleetModel)
                 else {})
        return {"context_window": window, "context_window_source": fit.source, "trained_context": fit.trained,
                **fleet}

    @property
    def fleet(self) -> Fleet | None:
        return self.parts.running.fleet

    def count_tokens(self, model: str, ctx: RequestContext) -> TokenCount:
        return self.registry.get(model).count_tokens(ctx.gen)

    def model_names(self) -> list[str]:
        """Configured models, routes, then the packaged embedding models."""
        return [m.name for m in self.config.models] + list(self.routes) + self.packaged_embedders

    def models_for(self, authorization: str | None) -> list[str]:
        """The names a caller may use: all without keys; with keys, the presented key's (401 without one)."""
        names = self.model_names()
        if not self.keyring.enabled:
            return names
        allowed = self.keyring.lookup(authorization).allowed
        return names if allowed is None else [n for n in names if n in allowed]

    def reload(self) -> dict[str, Any]:
        """Re-read the config file and swap the parts it sets (Parts): keys, tenants, routes, budgets' limits
        (Budgets.set_limits: spend and holds kept), cool-down settings, metric names and which bodies the ledger
        stores apply to the next request; a request in flight ends on the parts it started with. Everything in
        Running is kept: models (a change to them needs a restart), rate windows, spend, caches."""
        if self.config_path is None:
            raise APIError(400, "tokenomy was started without a config file; nothing to reload.")
        if self.worker is not None:     # it would reach the one worker that took the request
            raise APIError(400, f"tokenomy runs {self.config.server.workers} API workers; a reload would reach only "
                           "the one that answered. Restart tokenomy to load the new config.", code="restart_needed")
        try:
            new = served(load_config(self.config_path, self.cli_models), self.parts.running.left_out)
        except ConfigError as e:
            raise APIError(400, str(e), code="invalid_config") from e
        new = new.model_copy(update={"models": [*new.models, *(a for a in self.added
                                                               if a.name not in {m.name for m in new.models})]})
        if [m.model_dump() for m in new.models] != [m.model_dump() for m in self.config.models]:
            raise APIError(400, "models changed: restart tokenomy to load them.", code="restart_needed")
        with self._keys_lock:
            parts = build_parts(new, self, self.parts)
            run = parts.running
            self._set_limits(parts)
            run.metrics.names = model_names(new, run.packaged_embedders)
            c = new.cooldown
            run.registry.failures, run.registry.window_s, run.registry.cooldown_s = c.failures, c.window_s, \
                c.cooldown_s
            self.parts = parts
        return {"reloaded": True, "keys": len(new.keys), "routes": sorted(new.routes)}

    def add_model(self, spec: EmbeddedModelSpec) -> None:
        """Serve `spec` from now on (a model pulled through the Ollama API): made available in the fleet, loaded on
        its first request, listed everywhere the configured models are, and kept by a reload. APIError 400 without
        a fleet (server.workers > 1) or when memory cannot hold it at all."""
        fleet = self.fleet
        if fleet is None or self.worker is not None:
            raise APIError(400, f"tokenomy runs {self.config.server.workers} API workers: "
                           f"add model {spec.name!r} to the config and restart", code="restart_needed")
        with self._keys_lock:
            if spec.name in self.model_names():
                return
            config = self.config.model_copy(update={"models": [*self.config.models, spec]})
            try:
                backend = fleet_member(spec, config, fleet, self.parts.running.fits, None)
            except DoesNotFit as e:
                raise APIError(400, str(e), param="model", code="model_too_large") from None
            assert backend is not None
            self.registry.add(backend)
            self.added.append(spec)
            parts = build_parts(config, self, self.parts, stored=self.parts.stored)
            parts.running.metrics.names = model_names(config, parts.running.packaged_embedders)
            self.parts = parts
        log.info("serving %s (%s) from now on: available, loaded on its first request", spec.name, spec.gguf)

    async def remove_model(self, name: str) -> bool:
        """Stop serving `name` if it was added while serving (add_model): no longer listed or routed to, its engine
        ended now or when its running requests end. False for any other name (a configured model needs its config
        entry removed and a restart)."""
        spec = next((a for a in self.added if a.name == name), None)
        if spec is None:
            return False
        with self._keys_lock:
            self.added.remove(spec)
            config = self.config.model_copy(update={"models": [m for m in self.config.models if m.name != name]})
            self.registry.remove(name)
            self.parts.running.fits.pop(name, None)
            parts = build_parts(config, self, self.parts, stored=self.parts.stored)
            parts.running.metrics.names = model_names(config, parts.running.packaged_embedders)
            self.parts = parts
        if self.fleet is not None:
            await self.fleet.remove(name)
        log.info("no longer serving %s", name)
        return True

    def _set_limits(self, parts: Parts) -> None:
        lim = parts.config.limits
        parts.running.budgets.set_limits(**budget_limits(parts.config, parts.keyring, parts.stored),
                                         fail_open=lim.budgets_on_store_down == "open", allowances=lim.allowances)

    def refresh_keys(self) -> bool:
        """Rebuild the keyring and the budgets' limits from a new snapshot of the key store and swap them whole
        (build_parts), if its version is newer than the one held; True when swapped. Called by the gateway that made
        a change before it answers, and by every gateway when its poll sees the version move. Never swaps back to
        an older version: two refreshes racing end on the newest."""
        store = self.parts.running.key_store
        if store is None:
            return False
        with self._keys_lock:
            snap = store.snapshot()
            held = self.parts.stored
            if held is not None and snap.version <= held.version:
                return False
            parts = build_parts(self.config, self, self.parts, stored=snap)
            self._set_limits(parts)
            self.parts = parts
        log.info("keys and tenants: version %d loaded", snap.version)
        return True

    async def _watch_keys(self) -> None:
        """Poll the key store's version; refresh when another gateway moved it."""
        store = self.parts.running.key_store
        assert store is not None
        while True:
            await asyncio.sleep(self.keys_poll_s)
            try:
                held = self.parts.stored
                if await asyncio.to_thread(store.version) != (held.version if held is not None else -1):
                    await asyncio.to_thread(self.refresh_keys)
            except Exception as e:      # a database that does not answer: keep the table held, try again
                log.warning("keys and tenants: cannot read the key store: %s: %s", e.__class__.__name__, e)

    async def handle(self, ctx: RequestContext) -> RequestContext:
        parts = self.parts           # the request runs on these to its end, whatever a reload swaps meanwhile
        pipeline = parts.embed_pipeline if ctx.gen.kind == "embedding" else parts.pipeline
        return await pipeline.run(ctx)

    def refused(self, api: str, error: APIError, headers: dict[str, str]) -> None:
        """Record a request to `api` refused before the pipeline (a body that could not be read or parsed): a
        ledger row with its status, no model, and the key and tenant when the key is valid."""
        kind = {"completions": "completion", "embeddings": "embedding", "ollama.embed": "embedding",
                "ollama.embeddings": "embedding"}.get(api, "chat")
        ctx = RequestContext(gen=GenRequest(model="", kind=kind, api=api), error=error, status=error.status,
                             headers=headers)
        parts = self.parts
        if parts.keyring.enabled:
            try:
                info = parts.keyring.lookup(headers.get("authorization"))
                ctx.key, ctx.key_id, ctx.tenant = info, info.key_id, info.tenant
            except APIError:
                pass
        parts.record.finish(ctx)

    def start(self) -> None:
        """Start background work that needs the running event loop (the batch worker, the preloads left)."""
        if self.parts.running.fleet is not None:
            self.parts.running.fleet.start()
        if self.batch_runner is not None:
            self.batch_runner.start()
        if self.parts.running.key_store is not None and self._keys_watch is None:
            self._keys_watch = asyncio.get_running_loop().create_task(self._watch_keys())

    async def close(self) -> None:
        run = self.parts.running
        if self._keys_watch is not None:
            self._keys_watch.cancel()
            self._keys_watch = None
        await run.reserve.close()
        if run.batch_runner is not None:
            await run.batch_runner.stop()
        await run.registry.close()
        for name in run.packaged_embedders:
            await run.embedders[name].close()
        await asyncio.to_thread(self.parts.context.close)     # the compressors every reload's context shares
        if run.semantic_cache is not None:
            run.semantic_cache.close()
        if run.ledger is not None:
            run.ledger.close()
        if run.shared is not None:        # allowances go back, and settles still queued go to Redis, before the end
            await asyncio.to_thread(run.budgets.close)
            await asyncio.to_thread(run.shared.close)
        if run.tracer is not None:         # exports what is left, bounded by the exporter's timeout
            await asyncio.to_thread(run.tracer.shutdown)
        if run.otel_metrics is not None:   # the same for the metrics
            await asyncio.to_thread(run.otel_metrics.shutdown)

"""The composition root: config -> backends, metrics and the pipeline. The API layer only talks to this."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tokenomy.backends.deployments import Registry
from tokenomy.backends.embedded import EmbeddedBackend
from tokenomy.backends.embedded_launch import engine_settings
from tokenomy.config import AnthropicModelSpec, Config, ConfigError, EmbeddedModelSpec, ModelSpec, load_config
from tokenomy.context.tokens import TokenCount
from tokenomy.engine.client import EngineAddress
from tokenomy.engine.launch import Launched
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest, Usage
from tokenomy.hardware.energy import EnergyAccount, EnergyMeter, detect
from tokenomy.ledger import pricing
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.pricing import PriceLike
from tokenomy.ledger.responses_store import ResponseStore
from tokenomy.limits.budget import Budgets
from tokenomy.limits.shared_counters import SharedCounters
from tokenomy.metrics.prometheus import Metrics
from tokenomy.models.catalog import PACKAGED_EMBEDDINGS
from tokenomy.models.memory import Fit
from tokenomy.pipeline.admit import Admit, Keyring, hash_key
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

log = logging.getLogger("tokenomy")


def build_backend(spec: ModelSpec, config: Config, *, metrics: Metrics | None = None,
                  n_threads: int | None = None, fits: dict[str, Fit] | None = None,
                  engines: dict[str, EngineAddress] | None = None, launched: dict[str, Launched] | None = None,
                  wait: bool = True) -> Any:
    """The backend for one configured model: the embedded engine (started here with engine_settings, or the one
    at ``engines[name]`` that a supervisor runs: server/workers.py, or the one launched for it before the gateway was
    built: ``launched[name]``, embedded_launch.py), the OpenAI-compatible upstream (a pool of them
    with `replicas`) or the Messages upstream. Raises ConfigError for what only shows at start (a key's variable
    unset), DoesNotFit for a model memory cannot hold. Without `wait` an embedded engine is left starting: its
    backend's engine.wait_ready() finishes the start."""
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


class Gateway:
    def __init__(self, config: Config, config_path: str | None = None, models: list[str] | None = None,
                 engines: dict[str, EngineAddress] | None = None, worker: int | None = None,
                 wait: bool = True, launched: dict[str, Launched] | None = None) -> None:
        """Start every model and build the pipeline. The engine processes load their models while the rest is
        built here (the semantic cache's embedder among it); `wait`: return once they have passed their self-checks
        (raising EngineStartError for one that failed), else the caller calls wait_ready() before serving.
        `engines` and `worker`: an API worker of `server.workers` (server/workers.py) uses the engine processes its
        supervisor runs, and keeps its semantic index apart from the other workers'. `launched`: engine processes
        started before the gateway (embedded_launch.launch_engines), taken over (and taken out of the dict) by
        the embedded backends of their models."""
        self.config = config
        self.worker = worker
        self.config_path = config_path
        self.cli_models = models or []      # named on the command line: a reload keeps them
        self.metrics = Metrics()
        # the packaged embedding models a configured model or route does not shadow: served without config
        self.packaged_embedders = [n for n in PACKAGED_EMBEDDINGS
                                   if n not in {m.name for m in config.models} and n not in config.routes]
        self.metrics.names = {m.name for m in config.models} | set(config.routes) | set(self.packaged_embedders)
        self.registry = Registry(config.cooldown.failures, config.cooldown.window_s, config.cooldown.cooldown_s)
        for spec in config.models:      # a missing upstream key stops the start before any model loads
            if isinstance(spec, AnthropicModelSpec):
                spec.api_key()
        self.fits: dict[str, Fit] = {}     # each embedded model's window and bytes, checked before it loads
        for spec in config.models:
            self.registry.add(build_backend(spec, config, metrics=self.metrics, fits=self.fits, engines=engines,
                                            launched=launched, wait=False))
        self.metrics.watch_engines(self.engines)
        self.metrics.watch_pools(self.pools)
        for name, engine in self.engines():
            self._watch_engine(name, engine)
        self.keyring = Keyring(config.keys, config.tenants)
        self.routes = dict(config.routes)     # shared with the stages, updated in place on reload
        led = config.ledger
        self.ledger = Ledger(led.url, prompt_retention_s=led.retention_days * 86400) if led else None
        e = config.energy
        self.energy_meter = EnergyMeter(detect(e.watts_per_core, prefer=None if e.source == "auto" else e.source))
        self.energy = EnergyAccount(self.energy_meter)
        self.metrics.watch_hardware(self.energy_meter)
        if self.ledger is not None:
            self.metrics.watch_ledger(self.ledger)
        for _, engine in self.engines():
            engine.stats.on_step_seqs.append(self.energy.on_step)
        lim = config.limits
        self.shared = SharedCounters(lim.store, timeout_s=lim.timeout_s) if lim.store != "local" else None
        self.budgets = self._budgets(config)
        if self.shared is not None:
            self.metrics.watch_limits(self.shared)
            self.shared.on_recover.append(lambda: self.budgets.reseed())   # the budgets of the latest reload
        admit = Admit(self.keyring, self.shared, fail_open=lim.rates_on_store_down == "open",
                      lease_s=lim.lease_s)
        self.prices = config.prices()     # models change only with a restart
        self.meter = MeterSink(self.ledger, self.prices, self.metrics,
                               self.budgets, self.energy, {m.name: m.backend for m in config.models},
                               store_prompts=led.stores_prompts if led is not None and led.store_prompts else None)
        durable = self._commit_ledger if self.ledger is not None and config.ledger_durable else None
        # budgets and tpm: the worst case held before a backend sees the request; the record's sinks settle it
        self.reserve = Reserve(self.budgets, admit, self.price, self.window, lim)
        self.tracer = self._tracer(config)
        self.otel_metrics = self._otel_metrics(config)
        self.record = Record(self.metrics, sinks=[admit.on_record, self.meter, self.reserve.on_record],
                             durable=durable, tracer=self.tracer, otel=self.otel_metrics)
        # Record wraps the whole chain so that it runs last, for every request, errors and early endings too.
        self.exact_cache, self.semantic_cache = self._caches(config)
        self.metrics.watch_caches(self.cache_stores)
        self.context = Context(self.count_tokens, self.routes, summarize=self.summarize, input_price=self.input_price,
                               window=self.window,
                               on_break=lambda reason: self.metrics.prefix_breaks.labels(reason).inc())
        self.pipeline = Pipeline([
            self.record,
            admit,
            self.context,
            Cache(self.exact_cache, self.semantic_cache, self.cost,
                  set(config.cache.semantic.routes) if config.cache.semantic.routes is not None else None,
                  deterministic_only=config.cache.exact.deterministic_only),
            Route([m.name for m in config.models], self.routes,
                  expected_wait=lambda name: self.registry.get(name).expected_wait_s(),
                  metrics=self.metrics, backends=self.registry, embedding_models=self.packaged_embedders),
            self.reserve,
            Generate(self.registry, {m.name: m.schema_policy for m in config.models if m.backend != "embedded"},
                     self.metrics),
        ])
        # Embeddings: keys, limits, budgets and the ledger as for a generation; nothing of context, cache or route
        self.embedders = self._embedders(config)
        self.embed_pipeline = Pipeline([self.record, admit, self.reserve, Embed(self.embedders, self.registry,
                                                                  [m.name for m in config.models], self.routes)])

        self.batches, self.batch_runner = self._batch(config)
        self.responses = self._responses()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait for every embedded engine to pass its start-up self-check (EngineStartError for one that failed)."""
        for _, engine in self.engines():
            engine.wait_ready()

    def _tracer(self, config: Config) -> trace.Tracer | None:
        """The request tracer (telemetry/trace.py); None when tracing is off. Prompts and answers go on spans only
        with telemetry.capture_content, and for the tenants whose bodies the ledger keeps (read at each request,
        so a reload's store_prompts applies)."""
        settings = trace.resolve(config.telemetry)
        if settings is None:
            return None
        return trace.Tracer(settings, {m.name: trace.PROVIDERS.get(m.backend, m.backend) for m in config.models},
                            content=lambda tenant: self.meter.store_prompts is not None
                            and self.meter.store_prompts(tenant))

    def _otel_metrics(self, config: Config) -> otel_metrics.OtelMetrics | None:
        """The GenAI OTel metrics (telemetry/otel_metrics.py); None when they are off. Model names as the Prometheus
        labels have them (a reload's names apply)."""
        settings = otel_metrics.resolve(config.telemetry)
        if settings is None:
            return None
        return otel_metrics.OtelMetrics(
            settings, {m.name: trace.PROVIDERS.get(m.backend, m.backend) for m in config.models},
            otel_metrics.servers(config.models), label=self.metrics.label)

    def _responses(self) -> ResponseStore | None:
        """Stored Responses API answers (in the ledger's database, kept as long as its stored bodies); None without
        a ledger."""
        if self.ledger is None:
            return None
        return ResponseStore(self.ledger.engine, self.ledger.prompt_retention_s)

    def _embedders(self, config: Config) -> dict[str, Any]:
        """The embedding models by name: every OpenAI-compatible upstream (its /embeddings), then the packaged
        MiniLM on the semantic cache's embedder."""
        from tokenomy.backends.minilm import MiniLMBackend

        out: dict[str, Any] = {m.name: self.registry.get(m.name) for m in config.models if m.backend == "openai"}
        for name in self.packaged_embedders:
            out[name] = MiniLMBackend(name, PACKAGED_EMBEDDINGS[name].dimensions,
                                      threads=config.cache.semantic.embed_threads)
        return out

    def _batch(self, config: Config) -> tuple[Any, Any]:
        """The Batch API's store (in the ledger's database) and its worker; (None, None) without a ledger."""
        if self.ledger is None or not config.batch.enabled:
            return None, None
        from tokenomy.batch.database import BatchStore
        from tokenomy.batch.worker import BatchRunner

        b = config.batch
        store = BatchStore(self.ledger.engine)
        runner = BatchRunner(store, self.handle, concurrency=b.concurrency, poll_s=b.poll_s, drain_s=b.drain_s,
                             flush=self.ledger.flush, upstream=lambda m: bool(self._upstreams(m)),
                             hold=self._hold_batch,
                             upstream_concurrency=b.upstream_concurrency, lease_s=b.lease_s)
        return store, runner

    def _hold_batch(self, model: str) -> bool:
        """Whether batch work for `model` should wait: an upstream it may go to expects a queue wait above
        batch.upstream_max_wait_s, or (a pool) every replica publishes more than batch.upstream_max_queued waiting."""
        b = self.config.batch
        for name in self._upstreams(model):
            backend = self.registry.get(name)
            queued = backend.queued() if hasattr(backend, "queued") else None
            if backend.expected_wait_s() > b.upstream_max_wait_s or (queued is not None
                                                                     and queued > b.upstream_max_queued):
                return True
        return False

    def _upstreams(self, name: str) -> list[str]:
        """The upstream (openai and anthropic backend) models a model or route name may be served by."""
        names = self.routes[name].models if name in self.routes else [name]
        return [m.name for m in self.config.models if m.name in names and m.backend != "embedded"]

    def _budgets(self, config: Config) -> Budgets:
        keys = {(k.key_sha256.lower() if k.key_sha256 else hash_key(k.key or ""))[:12]: k.budget
                for k in config.keys if k.budget}
        b = Budgets(keys=keys, tenants={t: s.budget for t, s in config.tenants.items() if s.budget},
                    key_names={i.key_id: i.name for i in self.keyring.by_hash.values()}, metrics=self.metrics,
                    shared=self.shared, fail_open=config.limits.budgets_on_store_down == "open",
                    lease_s=config.limits.lease_s, allowances=config.limits.allowances)
        if self.ledger is not None:
            b.seed(self.ledger)
        return b

    def _caches(self, config: Config) -> tuple[Any, Any]:
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
            index = path / ("semantic" if not self.worker else f"semantic-worker{self.worker}")
            semantic = SemanticCache(index, store=store("semantic", s.max_entries),
                                     threshold=s.threshold, error_budget=s.error_budget, ttl_s=s.ttl_s,
                                     max_entries=s.max_entries, embed_threads=s.embed_threads,
                                     min_margin=s.min_margin, explore=s.explore,
                                     explore_window=s.explore_window)
            semantic.warm()
        return exact, semantic

    async def _commit_ledger(self) -> None:
        """Wait, off the event loop, until every ledger row written so far is committed (ledger_durable)."""
        assert self.ledger is not None
        await asyncio.to_thread(self.ledger.flush)

    def cache_stores(self) -> list[tuple[str, Any]]:
        return [(name, c.store) for name, c in (("exact", self.exact_cache), ("semantic", self.semantic_cache))
                if c is not None]

    def price(self, model: str, batch: bool = False) -> PriceLike | None:
        """A configured model's price (by its name, else its gguf: Config.prices) for one request, the batch price
        for a batch request (meter.pricing.price_of); None for a model not configured."""
        return pricing.price_of(self.prices, model, batch)

    def cost(self, model: str, usage: Usage, batch: bool = False) -> float:
        """USD for a generation: uncached input, cached input, cache writes and output each at their own price."""
        p = self.price(model, batch)
        return 0.0 if p is None else pricing.usage_cost(p, usage).total_usd

    def engines(self) -> list[tuple[str, Any]]:
        return [(n, b.engine) for n, b in self.registry.backends.items() if isinstance(b, EmbeddedBackend)]

    def pools(self) -> list[Any]:
        from tokenomy.backends.pool import Pool

        return [b for b in self.registry.backends.values() if isinstance(b, Pool)]

    def _watch_engine(self, name: str, engine: Any) -> None:
        m = self.metrics
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
            self.energy.pop(req.request_id)      # no row of its own: charged to the request it compacts
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
        if isinstance(backend, EmbeddedBackend):
            return backend.engine.max_model_len or None
        return None

    def window_source(self, model: str) -> dict[str, Any]:
        """`/v1/models` fields of an embedded model: its context window and where it came from (gguf: the trained
        context; memory: that cut to what memory holds; config: engine.n_ctx / max_model_len); {} otherwise."""
        fit, window = self.fits.get(model), self.window(model)
        if fit is None or window is None:
            return {}
        return {"context_window": window, "context_window_source": fit.source, "trained_context": fit.trained}

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
        """Re-read the config file: keys, routes and cool-down settings change in place; models need a restart."""
        if self.config_path is None:
            raise APIError(400, "tokenomy was started without a config file; nothing to reload.")
        if self.worker is not None:     # it would reach the one worker that took the request
            raise APIError(400, f"tokenomy runs {self.config.server.workers} API workers; a reload would reach only "
                           "the one that answered. Restart tokenomy to load the new config.", code="restart_needed")
        try:
            new = load_config(self.config_path, self.cli_models)
        except ConfigError as e:
            raise APIError(400, str(e), code="invalid_config") from e
        if [m.model_dump() for m in new.models] != [m.model_dump() for m in self.config.models]:
            raise APIError(400, "models changed: restart tokenomy to load them.", code="restart_needed")
        self.keyring.__init__(new.keys, new.tenants)  # type: ignore[misc]
        fresh = self._budgets(new)
        fresh.holding, fresh._held = self.budgets.holding, self.budgets._held   # requests in flight keep theirs
        if self.budgets.allowances is not None:     # taken under the old limits: each goes back once its requests end
            fresh.allowances = self.budgets.allowances.retire()
        self.budgets.__dict__.update(fresh.__dict__)
        self.routes.clear()
        self.routes.update(new.routes)
        self.metrics.names = {m.name for m in new.models} | set(new.routes) | set(self.packaged_embedders)
        self.registry.failures = new.cooldown.failures
        self.registry.window_s, self.registry.cooldown_s = new.cooldown.window_s, new.cooldown.cooldown_s
        led = new.ledger
        self.meter.store_prompts = led.stores_prompts if led is not None and led.store_prompts else None
        self.config = new
        return {"reloaded": True, "keys": len(new.keys), "routes": sorted(new.routes)}

    async def handle(self, ctx: RequestContext) -> RequestContext:
        pipeline = self.embed_pipeline if ctx.gen.kind == "embedding" else self.pipeline
        return await pipeline.run(ctx)

    def refused(self, api: str, error: APIError, headers: dict[str, str]) -> None:
        """Record a request to `api` refused before the pipeline (a body that could not be read or parsed): a
        ledger row with its status, no model, and the key and tenant when the key is valid."""
        kind = {"completions": "completion", "embeddings": "embedding", "ollama.embed": "embedding",
                "ollama.embeddings": "embedding"}.get(api, "chat")
        ctx = RequestContext(gen=GenRequest(model="", kind=kind, api=api), error=error, status=error.status,
                             headers=headers)
        if self.keyring.enabled:
            try:
                info = self.keyring.lookup(headers.get("authorization"))
                ctx.key_id, ctx.tenant = info.key_id, info.tenant
            except APIError:
                pass
        self.record.finish(ctx)

    def start(self) -> None:
        """Start background work that needs the running event loop (the batch worker)."""
        if self.batch_runner is not None:
            self.batch_runner.start()

    async def close(self) -> None:
        await self.reserve.close()
        if self.batch_runner is not None:
            await self.batch_runner.stop()
        await self.registry.close()
        for name in self.packaged_embedders:
            await self.embedders[name].close()
        await asyncio.to_thread(self.context.close)
        if self.semantic_cache is not None:
            self.semantic_cache.close()
        if self.ledger is not None:
            self.ledger.close()
        if self.shared is not None:        # allowances go back, and settles still queued go to Redis, before the end
            await asyncio.to_thread(self.budgets.close)
            await asyncio.to_thread(self.shared.close)
        if self.tracer is not None:         # exports what is left, bounded by the exporter's timeout
            await asyncio.to_thread(self.tracer.shutdown)
        if self.otel_metrics is not None:   # the same for the metrics
            await asyncio.to_thread(self.otel_metrics.shutdown)

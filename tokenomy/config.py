"""The one YAML file, validated by pydantic. Every option has a default, so no file at all runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenomy.engine.config import EngineConfig
from tokenomy.models import DEFAULT_MODEL, PACKAGED


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetLimits(_Strict):
    """Limits for one key or tenant; any left out is unlimited. Meant for the config file."""

    usd_per_day: float | None = Field(None, gt=0)
    usd_per_month: float | None = Field(None, gt=0)
    tokens_per_day: int | None = Field(None, gt=0)
    tokens_per_month: int | None = Field(None, gt=0)
    warn_at: float = Field(0.8, gt=0, le=1, description="share of a limit that logs a warning")

    def limit(self, unit: str, period: str) -> float | None:
        return getattr(self, f"{unit}_per_{period}")


class Price(_Strict):
    """USD per 1M tokens."""

    input: float = Field(0.0, ge=0)
    cached_input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)
    notional: bool = False      # a made-up price for a packaged model; reports say so
    batch_discount: float = Field(0.5, ge=0, le=1, description="share taken off every rate for batch requests "
                                  "(OpenAI's Batch API: 0.5)")

    def for_batch(self) -> Price:
        """The rates a batch request is billed at."""
        keep = 1.0 - self.batch_discount
        return self.model_copy(update={"input": self.input * keep, "cached_input": self.cached_input * keep,
                                       "output": self.output * keep})


class StructuredSettings(_Strict):
    """Constrained decoding on an embedded model. Every option only narrows what the grammar allows, so answers
    still validate against the request's schema. The size bounds change what a valid answer may hold (a list cut
    to max_array_items), so they are off for a GGUF path; a packaged model starts from its measured defaults
    (models.PackagedModel.structured), and each field set here overrides one (null turns it off)."""

    break_loops: bool = True                     # ban the token that continues a span repeated verbatim
    wrap_up: float | None = Field(None, gt=0, lt=1, description="past this share of max_tokens, only tokens "
                                  "that close the JSON (so a long answer ends valid instead of cut)")
    max_string_length: int | None = Field(None, ge=1, description="default maxLength of free strings")
    max_array_items: int | None = Field(None, ge=1, description="default maxItems of unbounded arrays")


class BalanceSettings(_Strict):
    """How a model with several `replicas` picks one (tokenomy/backends/pool.py)."""

    policy: Literal["least_outstanding", "prefix", "session", "round_robin"] = "least_outstanding"
    margin: int = Field(4, ge=0, description="prefix: send to the replica holding the longest prompt prefix "
                        "unless its load exceeds the least-loaded replica's by more than this many requests")
    affinity_header: str = Field("x-session-id", description="session: the request header that names a session "
                                 "(else the request's `user` field)")
    block_chars: int = Field(256, ge=16, description="prefix: characters per hashed block of the rendered prompt")
    max_blocks: int = Field(200_000, ge=1, description="prefix: block hashes remembered, all replicas together")
    eject_after: int = Field(3, ge=1, description="consecutive failures that eject a replica")
    eject_s: float = Field(2.0, gt=0, description="first ejection's length; doubles with each ejection in a row")
    max_eject_s: float = Field(60.0, gt=0)
    check_interval_s: float = Field(5.0, ge=0, description="active health checks and load-signal scrapes (0: off)")


class ModelSpec(_Strict):
    name: str
    backend: Literal["embedded", "openai"] = "embedded"
    gguf: str | None = None                      # embedded: packaged name or path
    base_url: str | None = None                  # openai: http://host:port/v1
    replicas: list[str] | None = None            # openai: several OpenAI-compatible servers of the same model
    balance: BalanceSettings = BalanceSettings()  # how a request picks one of the replicas
    model: str | None = None                     # openai: the upstream's model name
    api_key_env: str | None = None               # openai: env var holding the upstream key (never the key)
    tokenizer: str | None = None                 # a tiktoken encoding or a packaged model name to count with
    price: Price | None = None
    engine: EngineConfig | None = None         # per-model engine overrides
    timeout_s: float = Field(60.0, gt=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    deadline_s: float | None = Field(None, gt=0, description="openai: the most one request may wait for the "
                                     "upstream's first byte, retries included (default: timeout_s)")
    retry_after_send: bool = Field(False, description="openai: also retry a request the upstream may have "
                                   "received (a read timeout or a dropped connection): it may be generated and "
                                   "billed twice")
    schema_policy: Literal["flag", "repair"] = "flag"   # openai: an answer that breaks its schema
    structured: StructuredSettings = StructuredSettings()   # embedded: constrained decoding

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.backend == "embedded":
            self.gguf = self.gguf or (self.name if self.name in PACKAGED else None)
            if not self.gguf:
                raise ValueError(f"model {self.name!r}: embedded models need `gguf` (a packaged model or a path)")
            if self.price is None and self.gguf in PACKAGED:
                p = PACKAGED[self.gguf]
                self.price = Price(input=p.price_input, cached_input=p.price_cached_input,
                                   output=p.price_output, notional=True)
            if self.gguf in PACKAGED:
                chosen = self.structured.model_dump(exclude_unset=True)
                self.structured = StructuredSettings(**{**PACKAGED[self.gguf].structured, **chosen})
            if self.replicas is not None:
                raise ValueError(f"model {self.name!r}: `replicas` are OpenAI-compatible servers; run more "
                                 "tokenomy engines and list their URLs under an `openai` model")
        else:
            if self.replicas is not None:
                if not self.replicas:
                    raise ValueError(f"model {self.name!r}: `replicas` is empty; list at least one URL")
                urls = [u.rstrip("/") for u in self.replicas]
                if len(set(urls)) != len(urls):
                    raise ValueError(f"model {self.name!r}: a replica is listed twice in `replicas`")
                if self.base_url and [self.base_url.rstrip("/")] != urls:
                    raise ValueError(f"model {self.name!r}: give `base_url` (one server) or `replicas` (several), "
                                     "not both")
                self.replicas = urls
            elif not self.base_url:
                raise ValueError(f"model {self.name!r}: openai backends need `base_url` (or `replicas`)")
            self.model = self.model or self.name
        self.price = self.price or Price()
        return self


class RuleWhen(_Strict):
    """All given conditions must hold for the rule to match."""

    min_prompt_tokens: int | None = Field(None, ge=0)
    max_prompt_tokens: int | None = Field(None, ge=0)
    regex: str | None = None                     # searched in the last user message
    keywords: list[str] | None = None            # any of them, case-insensitive, in the last user message
    has_tools: bool | None = None
    has_response_format: bool | None = None
    tenant: str | None = None
    metadata: dict[str, str] | None = None       # request header x-tokenomy-meta-<key>: <value>

    @model_validator(mode="after")
    def _regex(self) -> RuleWhen:
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"invalid regex {self.regex!r}: {e}") from e
        return self


class RuleSpec(_Strict):
    when: RuleWhen
    model: str


class CascadeSettings(_Strict):
    min_mean_logprob: float = -1.0               # escalate when the answer's mean token logprob is below
    min_token_logprob: float = -9.0              # ... or any single token is below this
    escalate_on_invalid_json: bool = True
    escalate_on_empty: bool = True
    escalate_on_refusal: bool = True
    escalate_on_truncated: bool = True
    stream_buffer_tokens: int = Field(24, ge=1, description="streams: tokens judged before the first byte is sent")


class TokenRouteSettings(_Strict):
    """Token-level routing (router/token_routing.py), the one settings class of a `token` route: the route's first
    model writes, its second takes over where the first is unsure. `threshold` is on the `signal` (lower is less
    sure; `tokenomy router calibrate --token` picks one for a target share of large-model tokens)."""

    signal: Literal["top1", "margin", "entropy"] = Field(
        "entropy", description="how sure the small model is of its next token (engine/sampler.confidence): top1, "
                               "the most likely token's probability; margin, the first minus the second; entropy, "
                               "the negated entropy in nats. Lower is less sure for all three")
    threshold: float = Field(-3.2, description="hand over when the small model's signal is below this (entropy: "
                             "the negated entropy in nats; -3.2 gave SmolLM2 about 20% large-model tokens on "
                             "docs/token_routing.md's prompts)")
    segment: Literal["word", "token"] = Field(
        "word", description="what the large model's turn keeps: word, its text up to the end of its first word; "
                            "token, its one token")
    max_segment_tokens: int = Field(4, ge=1, le=64, description="segment word: the most the large model writes")
    template: str | None = Field(
        None, description="an upstream large model's chat template: a packaged model name or GGUF path whose "
                          "template renders its prompt (default: the small model's)")


class ClassifierSettings(_Strict):
    path: str                                    # a router file from `tokenomy router train`
    threshold: float | None = Field(None, ge=0, le=1)   # None: the calibrated threshold of the head that decides


class LoadSettings(_Strict):
    slo_queue_s: float = Field(1.0, gt=0, description="preferred model's expected queue wait above this -> cheaper")


class CompactionSettings(_Strict):
    """Compaction of conversation history (tokenomy/context/compaction.py)."""

    trigger_tokens: int = Field(ge=64, description="compact when the prompt passes this many tokens")
    keep_last_turns: int = Field(4, ge=1, description="the last turns are never touched")
    strategy: Literal["drop_middle", "summarize"] = "drop_middle"
    summary_model: str | None = None             # summarize: a configured model (a cheap one)
    max_summary_tokens: int = Field(256, ge=16, le=4096)
    mask_tool_outputs: bool = False              # first replace old tool results by a short note
    block_turns: int | None = Field(None, ge=1, description="turns replaced at a time (default keep_last_turns)")

    @model_validator(mode="after")
    def _check(self) -> CompactionSettings:
        if self.strategy == "summarize" and not self.summary_model:
            raise ValueError("strategy summarize needs `summary_model` (a configured model)")
        if self.strategy == "summarize" and self.max_summary_tokens >= self.trigger_tokens:
            raise ValueError("max_summary_tokens must be below trigger_tokens")
        return self


class CompressSettings(_Strict):
    """Prompt compression of long inputs (tokenomy/context/compress.py), only when it pays for itself."""

    target_ratio: float = Field(2.0, gt=1, le=20, description="input tokens / tokens kept")
    min_tokens: int = Field(512, ge=16, description="only messages at least this long are compressed")
    protect: list[Literal["system", "question", "code"]] = Field(
        default_factory=lambda: ["system", "question", "code"])
    model: str = Field(DEFAULT_MODEL, description="the small model whose token surprisal decides what stays "
                       "(a packaged model or a .gguf path)")

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value not in PACKAGED and not value.endswith(".gguf"):
            raise ValueError(f"compress.model must be a packaged model ({', '.join(PACKAGED)}) or a .gguf path")
        return value


class ContextSettings(_Strict):
    """The context stage's levers for one route; all off by default."""

    compaction: CompactionSettings | None = None
    compress: CompressSettings | None = None
    lint: bool = False              # prompt-layout lint (also on per request with header x-tokenomy-lint: on)
    rewrite: bool = False           # lint's safe fix: move date/time lines of the system prompt to the end


Strategy = Literal["fixed", "rules", "classifier", "load", "cascade", "token"]


class RouteSpec(_Strict):
    """Candidate models cheapest first. Strategies compose in this order: rules, classifier, load, cascade;
    `token` (token-level routing) stands alone."""

    strategy: Strategy | list[Strategy] = "fixed"
    models: list[str] = Field(min_length=1)
    context_budget: int | None = Field(None, ge=1)
    enforce: bool = False
    context: ContextSettings = ContextSettings()
    rules: list[RuleSpec] = Field(default_factory=list)
    classifier: ClassifierSettings | None = None
    load: LoadSettings = LoadSettings()
    cascade: CascadeSettings = CascadeSettings()
    token: TokenRouteSettings = TokenRouteSettings()

    @property
    def strategies(self) -> list[str]:
        return [self.strategy] if isinstance(self.strategy, str) else list(self.strategy)

    @model_validator(mode="after")
    def _check(self) -> RouteSpec:
        if "classifier" in self.strategies and self.classifier is None:
            raise ValueError("strategy classifier needs `classifier: {path: ...}`")
        if "rules" in self.strategies and not self.rules:
            raise ValueError("strategy rules needs at least one rule")
        if "token" in self.strategies and (self.strategies != ["token"] or len(self.models) != 2):
            raise ValueError("strategy token stands alone, with two models: [small, large]")
        return self


class CooldownSettings(_Strict):
    failures: int = Field(3, ge=1, description="failures within window_s that cool a deployment down")
    window_s: float = Field(60.0, gt=0)
    cooldown_s: float = Field(30.0, gt=0)


class KeySpec(_Strict):
    key: str | None = None                       # plain key (hashed at load) ...
    key_sha256: str | None = None                # ... or its sha256 hex
    name: str = "key"
    tenant: str = "default"
    admin: bool = False
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    budget: BudgetLimits | None = None
    models: list[str] | None = None              # model and route names this key may ask for; None: all

    @model_validator(mode="after")
    def _one(self) -> KeySpec:
        if bool(self.key) == bool(self.key_sha256):
            raise ValueError(f"key {self.name!r}: give exactly one of `key` or `key_sha256`")
        return self


class ExactCacheSettings(_Strict):
    enabled: bool = True
    ttl_s: float = Field(86400.0, gt=0)
    max_entries: int = Field(10000, ge=1)
    deterministic_only: bool = True      # only temperature 0 or seeded requests (others asked for randomness)


class SemanticCacheSettings(_Strict):
    enabled: bool = True
    threshold: float = Field(0.9, gt=0, le=1)
    error_budget: float | None = Field(0.02, gt=0, lt=1, description="tolerated share of wrong hits")
    ttl_s: float = Field(86400.0, gt=0)
    max_entries: int = Field(100000, ge=1)
    routes: list[str] | None = None      # models/routes allowed to use it; None = all
    embed_threads: int = Field(1, ge=1, le=64, description="threads for the MiniLM embedding of a lookup")
    min_margin: float = Field(0.02, ge=0, lt=1, description="serve only when the best stored question beats the "
                              "next one by this much cosine (an ambiguous pair of candidates is a miss)")


class CacheSettings(_Strict):
    path: str = "tokenomy-cache"         # SQLite files and ANN indexes (local store)
    store: str = "local"                 # local | redis://host:port/db (payloads shared by replicas)
    exact: ExactCacheSettings = ExactCacheSettings()
    semantic: SemanticCacheSettings = SemanticCacheSettings()

    @model_validator(mode="after")
    def _store(self) -> CacheSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("cache.store must be 'local' or a redis:// URL")
        return self


class LimitsSettings(_Strict):
    """Where rate limits and budget spend are counted: `local` (this process) or a Redis that every gateway
    replica shares. What happens while Redis does not answer: `open` admits unchecked, `closed` refuses (503)."""

    store: str = "local"                         # local | redis://host:port/db
    rates_on_store_down: Literal["open", "closed"] = "open"
    budgets_on_store_down: Literal["open", "closed"] = "closed"
    timeout_s: float = Field(0.25, gt=0, description="Redis socket timeout")

    @model_validator(mode="after")
    def _store(self) -> LimitsSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("limits.store must be 'local' or a redis:// URL")
        return self


class EnergySettings(_Strict):
    source: Literal["auto", "nvml", "rapl", "estimate"] = "auto"
    watts_per_core: float = Field(15.0, gt=0, description="CPU estimate: watts per busy core")


class TenantSpec(_Strict):
    budget: BudgetLimits | None = None
    models: list[str] | None = None              # model and route names the tenant's keys may ask for; None: all


class LedgerSettings(_Strict):
    """Where rows go, and whether request bodies and answers are kept beside them (for `tokenomy replay`).
    Bodies are personal data: off by default, per tenant when `store_prompts_tenants` lists them, deleted once
    older than `retention_days` (the rows themselves are kept)."""

    url: str = "sqlite:///tokenomy.db"           # or postgresql://user@host/db
    store_prompts: bool = False
    store_prompts_tenants: list[str] | None = None   # None: every tenant (when store_prompts is on)
    retention_days: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _tenants(self) -> LedgerSettings:
        if self.store_prompts_tenants is not None and not self.store_prompts:
            raise ValueError("store_prompts_tenants needs store_prompts: true")
        return self

    def stores_prompts(self, tenant: str) -> bool:
        return self.store_prompts and (self.store_prompts_tenants is None or tenant in self.store_prompts_tenants)


class BatchSettings(_Strict):
    """The Batch API (docs/batch.md): files and batches live in the ledger's database."""

    enabled: bool = True
    concurrency: int = Field(8, ge=1, le=256, description="batch requests in flight at once, all batches together")
    upstream_concurrency: int = Field(2, ge=1, description="batch requests in flight to one upstream model")
    upstream_max_wait_s: float = Field(0.5, ge=0, description="hold batch requests for an upstream model while its "
                                       "expected queue wait (the load signal routing uses) is above this")
    upstream_max_queued: float = Field(0, ge=0, description="hold batch requests for an upstream pool while every "
                                       "replica reports more than this many requests waiting (vLLM's "
                                       "num_requests_waiting and its kin, scraped)")
    max_file_bytes: int = Field(100 << 20, ge=1024)
    poll_s: float = Field(0.5, gt=0)
    drain_s: float = Field(10.0, ge=0, description="at shutdown, how long in-flight batch requests may finish")
    lease_s: float = Field(60.0, gt=0, description="gateways sharing a database: a batch request one of them "
                           "started is its own for this long, renewed while it runs; if that gateway dies, another "
                           "runs the request after this")


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(4 << 20, ge=1024)
    # with keys configured, these paths answer without one; /metrics, /docs and /openapi.json need any valid key
    # unless listed (a Prometheus scrape can send one as a bearer token)
    public: list[str] = Field(default_factory=lambda: ["/health"])


class Config(_Strict):
    server: ServerSettings = ServerSettings()
    engine: EngineConfig = EngineConfig()
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec(name=DEFAULT_MODEL)])
    routes: dict[str, RouteSpec] = Field(default_factory=dict)
    cooldown: CooldownSettings = CooldownSettings()
    keys: list[KeySpec] = Field(default_factory=list)
    cache: CacheSettings = CacheSettings()
    ledger: LedgerSettings | None = LedgerSettings()   # a URL alone is the url; null: no ledger
    # false: rows are committed by a background writer, usually within milliseconds of the answer, and a crash
    # in that window loses them; true: the answer's last byte waits for its row's commit
    ledger_durable: bool = False
    energy: EnergySettings = EnergySettings()
    batch: BatchSettings = BatchSettings()
    limits: LimitsSettings = LimitsSettings()
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)

    @field_validator("ledger", mode="before")
    @classmethod
    def _ledger_url(cls, value: object) -> object:
        return {"url": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _refs(self) -> Config:
        names = [m.name for m in self.models]
        if not names:
            raise ValueError("models: at least one model is needed")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"models: duplicate names {sorted(dup)}")
        for rname, r in self.routes.items():
            if rname in names:
                raise ValueError(f"routes.{rname}: a route may not share a model's name")
            missing = [m for m in r.models + [rule.model for rule in r.rules] if m not in names]
            if missing:
                raise ValueError(f"routes.{rname}.models: unknown models {missing}; known: {names}")
            if "token" in r.strategies and self.model(r.models[0]).backend != "embedded":
                raise ValueError(f"routes.{rname}: strategy token needs an embedded small model (its engine "
                                 f"judges every step); {r.models[0]} is an upstream")
            c = r.context.compaction
            if c is not None and c.summary_model is not None and c.summary_model not in names:
                raise ValueError(f"routes.{rname}.context.compaction.summary_model: unknown model "
                                 f"{c.summary_model!r}; known: {names}")
        known = set(names) | set(self.routes)
        for where, allowed in [(f"keys[{i}] ({k.name})", k.models) for i, k in enumerate(self.keys)] + [
                (f"tenants.{t}", spec.models) for t, spec in self.tenants.items()]:
            unknown = sorted(set(allowed or []) - known)
            if unknown:
                raise ValueError(f"{where}.models: unknown models or routes {unknown}; known: {sorted(known)}")
        digests = [(k.key_sha256 or "").lower() or hashlib.sha256((k.key or "").encode()).hexdigest()
                   for k in self.keys]
        dup = sorted({self.keys[i].name for i, d in enumerate(digests) if digests.count(d) > 1})
        if dup:   # the last one would win silently, perhaps making a tenant's key another's admin key
            raise ValueError(f"keys: the same key is listed more than once ({', '.join(dup)})")
        return self

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)


class ConfigError(ValueError):
    pass


def load_config(path: str | Path | None) -> Config:
    """Read and validate the YAML file (safe_load only: no tags execute). None -> defaults."""
    if path is None:
        return Config()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e}") from e
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML (or uses a tag that is not allowed): {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(lines)) from e

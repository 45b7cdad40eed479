"""The one YAML file's top level (`Config`), and loading it: validated by pydantic, every option with a default,
so no file at all runs. Each section is a module of its own beside this one: model_specs, routes, limits, caches,
operations.

Every field carries a description: `tokenomy config docs` renders them into docs/config.md and `tokenomy config
schema` into the JSON Schema editors complete the YAML with (tokenomy/config/docs.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from tokenomy.config.caches import CacheSettings
from tokenomy.config.fleet import FleetSettings
from tokenomy.config.limits import KeySpec, LimitsSettings, TenantSpec
from tokenomy.config.model_specs import BACKENDS, EmbeddedModelSpec, ModelSpec, Price
from tokenomy.config.operations import BatchSettings, EnergySettings, LedgerSettings, ServerSettings, TelemetrySettings
from tokenomy.config.routes import CooldownSettings, RouteSpec
from tokenomy.config.section import ConfigError, Section
from tokenomy.engine.config import EngineConfig
from tokenomy.models.catalog import DEFAULT_MODEL, PACKAGED, PACKAGED_EMBEDDINGS


class Config(Section):
    """The YAML file's top level."""

    server: ServerSettings = Field(ServerSettings(), description="the HTTP server")
    engine: EngineConfig = Field(EngineConfig(), description="the embedded engine, for every embedded model (each "
                                 "may override keys in its own `engine:`)")
    models: list[ModelSpec] = Field(default_factory=lambda: [EmbeddedModelSpec(name=DEFAULT_MODEL)],
                                    description="the models served; default: the packaged smollm2-135m-instruct, "
                                    "embedded")
    routes: dict[str, RouteSpec] = Field(default_factory=dict, description="route names clients may ask for "
                                         "instead of a model, each picking among models per request")
    cooldown: CooldownSettings = Field(CooldownSettings(), description="skipping a failing model for a while")
    keys: list[KeySpec] = Field(default_factory=list, description="API keys; none: no key needed")
    cache: CacheSettings = Field(CacheSettings(), description="the response caches")
    ledger: LedgerSettings | None = Field(LedgerSettings(), description="one row per request; a URL alone is "
                                          "`url`; null: no ledger (no budgets from history, no Batch API)")
    ledger_durable: bool = Field(False, description="false: rows are committed by a background writer, usually "
                                 "within milliseconds of the answer, and a crash in that window loses them; true: "
                                 "the answer's last byte waits for its row's commit")
    energy: EnergySettings = Field(EnergySettings(), description="energy measurement")
    batch: BatchSettings = Field(BatchSettings(), description="the Batch API")
    limits: LimitsSettings = Field(LimitsSettings(), description="where rate limits and budgets are counted")
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, description="limits per tenant name (keys name "
                                           "their tenant)")
    telemetry: TelemetrySettings = Field(TelemetrySettings(), description="OpenTelemetry traces and metrics (off "
                                         "by default)")
    fleet: FleetSettings = Field(FleetSettings(), description="embedded models loaded on demand, placed by memory, "
                                 "evicted by reload cost")

    @field_validator("ledger", mode="before", json_schema_input_type=LedgerSettings | str | None)
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
        known = set(names) | set(self.routes) | set(PACKAGED_EMBEDDINGS)    # keys may allow the packaged embedder
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
        for m in self.models:
            if isinstance(m, EmbeddedModelSpec) and m.engine is not None:
                m.engine = self._engine_for(m.name, m.engine)
        return self

    @model_validator(mode="after")
    def _workers(self) -> Config:
        problem = self.workers_problem(self.server.workers)
        if problem:
            raise ValueError(problem)
        return self

    def workers_problem(self, workers: int) -> str | None:
        """What stops `workers` API processes from serving this config as one (state that must be one across
        them in a store they share: docs/workers.md), or None."""
        if workers <= 1:
            return None
        limited = [f"keys[{i}] ({k.name})" for i, k in enumerate(self.keys) if k.rpm or k.tpm or k.budget] + [
            f"tenants.{t}" for t, spec in self.tenants.items()
            if spec.budget or getattr(spec, "rpm", None) or getattr(spec, "tpm", None)]
        if limited and self.limits.store == "local":
            return (f"server.workers: {workers} processes count rate limits and budgets together only in Redis "
                    f"({', '.join(limited[:3])} have limits): set limits.store: redis://host:port/db, or "
                    "server.workers: 1")
        url = self.ledger.url if self.ledger is not None else None
        if url in ("sqlite://", "sqlite:///:memory:", ":memory:"):
            return ("server.workers: an in-memory ledger would be one per worker; give ledger a file "
                    "(sqlite:///FILE) or postgresql://")
        return None
        limited = [f"keys[{i}] ({k.name})" for i, k in enumerate(self.keys) if k.rpm or k.tpm or k.budget] + [
            f"tenants.{t}" for t, spec in self.tenants.items()
            if spec.budget or getattr(spec, "rpm", None) or getattr(spec, "tpm", None)]
        if limited and self.limits.store == "local":
            raise ValueError(f"server.workers: {self.server.workers} processes count rate limits and budgets "
                             f"together only in Redis ({', '.join(limited[:3])} have limits): set limits.store: "
                             "redis://host:port/db, or server.workers: 1")
        url = self.ledger.url if self.ledger is not None else None
        if url in ("sqlite://", "sqlite:///:memory:", ":memory:"):
            raise ValueError("server.workers: an in-memory ledger would be one per worker; give ledger a file "
                             "(sqlite:///FILE) or postgresql://")
        return self

    def _engine_for(self, name: str, own: EngineConfig) -> EngineConfig:
        """A model's `engine:` over the top-level one, key by key (the keys each section was given)."""
        merged = {**self.engine.model_dump(exclude_unset=True), **own.model_dump(exclude_unset=True)}
        try:
            return EngineConfig.model_validate(merged)
        except ValidationError as e:
            problems = "; ".join(str(err.get("ctx", {}).get("error", err["msg"])) for err in e.errors())
            raise ValueError(f"model {name!r}: its `engine:` over the top-level one: {problems}") from None

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def prices(self) -> dict[str, Price]:
        """Every configured model's price by the names a request may give it: its name, and for an embedded model
        its gguf too (a name wins over another model's gguf), and the packaged embedding models' notional prices
        (a configured model of the same name wins). The one table every price lookup reads
        (meter.pricing.price_of)."""
        table: dict[str, Price] = {name: Price(input=e.price_input, notional=True)
                                   for name, e in PACKAGED_EMBEDDINGS.items()}
        table.update({m.gguf: m.price for m in self.models if isinstance(m, EmbeddedModelSpec)})
        table.update({m.name: m.price for m in self.models})
        return table


def _yaml_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as a path in the file: the backend tag pydantic puts after `models.N` is
    not a key of the file."""
    keys = [x for i, x in enumerate(loc) if not (i == 2 and loc[0] == "models" and x in BACKENDS)]
    return ".".join(str(x) for x in keys) or "(top level)"


def model_entry(ref: str) -> dict[str, Any]:
    """A model named on the command line -> its `models:` entry: `NAME=REF` names it; a packaged model is served
    under its name, a .gguf path under its file's stem, a hub model as ORG/REPO:QUANT (tokenomy/models/hub.py)."""
    from tokenomy.models import hub

    name, sep, gguf = ref.partition("=")
    if not sep or hub.is_hub_ref(ref):
        name, gguf = "", ref
    if not name:
        name = (hub.default_name(gguf) if hub.is_hub_ref(gguf) else gguf if gguf in PACKAGED
                else Path(gguf).name.removesuffix(".gguf"))
    return {"name": name, "gguf": gguf}


def with_models(data: dict[str, Any], refs: list[str]) -> dict[str, Any]:
    """A config's data with the models named on the command line: without a `models:` list they are the models
    (the packaged default is not served); with one they are added after it, and one named like a configured
    model takes its place but keeps that entry's other settings (engine, price, structured)."""
    if not refs:
        return data
    models = [dict(m) if isinstance(m, dict) else m for m in data.get("models") or []]
    for ref in refs:
        entry = model_entry(ref)
        same = [m for m in models if isinstance(m, dict) and m.get("name") == entry["name"]]
        if same:
            same[0].update(entry, backend="embedded")
        else:
            models.append(entry)
    return {**data, "models": models}


def with_discovered(config: Config) -> Config:
    """With fleet.discover, the config with every GGUF model found on this machine (models/discovery.py) added as
    an embedded model that loads on demand, unless a configured model has its name or its file."""
    if not config.fleet.discover:
        return config
    from tokenomy.models.discovery import discover

    names = {m.name for m in config.models}
    files = {str(Path(m.gguf).expanduser().absolute()) for m in config.models
             if isinstance(m, EmbeddedModelSpec) and m.gguf and m.gguf.endswith(".gguf")}
    found = [EmbeddedModelSpec(name=name, gguf=str(path), preload=False, discovered=True)
             for name, path in discover(config.fleet.models_dir).items()
             if name not in names and str(path.absolute()) not in files]
    return config.model_copy(update={"models": [*config.models, *found]}) if found else config


def load_config(path: str | Path | None, models: list[str] | None = None) -> Config:
    """Read and validate the YAML file (safe_load only: no tags execute), with `models` named on the command line
    (with_models) and, with fleet.discover, those found on this machine (with_discovered). None -> defaults."""
    return with_discovered(_load_config(path, models))


def _load_config(path: str | Path | None, models: list[str] | None = None) -> Config:
    if path is None:
        try:
            return Config.model_validate(with_models({}, models or [])) if models else Config()
        except ValidationError as e:
            lines = [f"  {_yaml_path(err['loc'])}: {err['msg']}" for err in e.errors()]
            raise ConfigError("invalid models on the command line\n" + "\n".join(lines)) from e
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
        return Config.model_validate(with_models(data, models or []))
    except ValidationError as e:
        lines = [f"  {_yaml_path(err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(lines)) from e

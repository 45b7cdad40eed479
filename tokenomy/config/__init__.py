"""The one YAML file, validated by pydantic: its top level and loading (settings.py), one module per section
(model_specs, routes, limits, caches, operations, on section.py's Section), its reference page (docs.py), and where
state lives by default (home.py). Every option has a default, so no file at all runs. The settings' public names are
imported from here: `from tokenomy.config import Config, load_config`."""

from tokenomy.config.caches import CacheSettings, ExactCacheSettings, SemanticCacheSettings
from tokenomy.config.fleet import FleetSettings, keep_alive_seconds
from tokenomy.config.limits import BudgetLimits, KeySpec, LimitsSettings, TenantSpec
from tokenomy.config.model_specs import (
    BACKENDS,
    AnthropicModelSpec,
    BalanceSettings,
    EmbeddedModelSpec,
    ModelSpec,
    OpenAIModelSpec,
    Price,
    StructuredSettings,
)
from tokenomy.config.operations import BatchSettings, EnergySettings, LedgerSettings, ServerSettings, TelemetrySettings
from tokenomy.config.routes import (
    CascadeSettings,
    ClassifierSettings,
    CompactionSettings,
    CompressSettings,
    ContextSettings,
    CooldownSettings,
    LoadSettings,
    RouteSpec,
    RuleSpec,
    RuleWhen,
    Strategy,
    TokenRouteSettings,
)
from tokenomy.config.section import ConfigError, Section
from tokenomy.config.settings import Config, load_config, model_entry, with_models

__all__ = [
    "BACKENDS", "AnthropicModelSpec", "BalanceSettings", "BatchSettings", "BudgetLimits", "CacheSettings",
    "CascadeSettings", "ClassifierSettings", "CompactionSettings", "CompressSettings", "Config", "ConfigError",
    "ContextSettings", "CooldownSettings", "EmbeddedModelSpec", "EnergySettings", "ExactCacheSettings",
    "FleetSettings", "KeySpec",
    "LedgerSettings", "LimitsSettings", "LoadSettings", "ModelSpec", "OpenAIModelSpec", "Price", "RouteSpec",
    "RuleSpec", "RuleWhen", "SemanticCacheSettings", "ServerSettings", "StructuredSettings", "TelemetrySettings",
    "TenantSpec", "TokenRouteSettings", "keep_alive_seconds", "load_config", "model_entry", "with_models", "Section",
    "Strategy",
]

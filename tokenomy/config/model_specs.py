"""The file's `models:` entries, one per backend kind (embedded, openai, anthropic), with their prices."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Field, Tag, model_validator

from tokenomy.config.fleet import KeepAlive, keep_alive_seconds
from tokenomy.config.section import ConfigError, Section
from tokenomy.engine.config import EngineConfig
from tokenomy.models.catalog import PACKAGED


class Price(Section):
    """A model's rates in USD per 1M tokens: the ledger's cost, budgets and the cost-aware strategies read them."""

    input: float = Field(0.0, ge=0, description="USD per 1M prompt tokens neither read from nor written to a "
                         "prompt cache")
    cached_input: float = Field(0.0, ge=0, description="USD per 1M prompt tokens served from a prompt (prefix) "
                                "cache")
    output: float = Field(0.0, ge=0, description="USD per 1M completion tokens")
    cache_write: float | None = Field(None, ge=0, description="USD per 1M prompt tokens written to the upstream's "
                                      "prompt cache (Anthropic's cache_creation_input_tokens; 1.25x input there "
                                      "for a 5-minute entry); null: the input price")
    notional: bool = Field(False, description="a made-up price (a packaged model's default); reports say so")
    batch_discount: float = Field(0.5, ge=0, le=1, description="share taken off every rate for batch requests "
                                  "(OpenAI's Batch API: 0.5)")

    def for_batch(self) -> Price:
        """The rates a batch request is billed at."""
        keep = 1.0 - self.batch_discount
        return self.model_copy(update={"input": self.input * keep, "cached_input": self.cached_input * keep,
                                       "output": self.output * keep,
                                       "cache_write": None if self.cache_write is None else self.cache_write * keep})


class StructuredSettings(Section):
    """Constrained decoding on an embedded model. Every option only narrows what the grammar allows, so answers
    still validate against the request's schema. The size bounds change what a valid answer may hold (a list cut
    to max_array_items), so they are off for a GGUF path; a packaged model starts from its measured defaults
    (models.PackagedModel.structured), and each field set here overrides one (null turns it off)."""

    break_loops: bool = Field(True, description="ban the token that continues a span the answer already repeated "
                              "verbatim (small models loop inside JSON strings); false: only the schema constrains")
    wrap_up: float | None = Field(None, gt=0, lt=1, description="past this share of max_tokens, only tokens "
                                  "that close the JSON (so a long answer ends valid instead of cut); null: off")
    max_string_length: int | None = Field(None, ge=1, description="maxLength, in characters, given to free strings "
                                          "the schema leaves unbounded; null: unbounded")
    max_array_items: int | None = Field(None, ge=1, description="maxItems given to arrays the schema leaves "
                                        "unbounded; null: unbounded")


class BalanceSettings(Section):
    """How a model with several `replicas` picks one (tokenomy/backends/pool.py)."""

    policy: Literal["least_outstanding", "prefix", "session", "round_robin"] = Field(
        "least_outstanding", description="least_outstanding: the replica with the fewest requests in flight; "
        "prefix: the one holding the longest prefix of the prompt (its prefix cache answers it), within `margin`; "
        "session: the same replica for a session; round_robin: in turn")
    margin: int = Field(4, ge=0, description="prefix: send to the replica holding the longest prompt prefix "
                        "unless its load exceeds the least-loaded replica's by more than this many requests")
    affinity_header: str = Field("x-session-id", description="session: the request header that names a session "
                                 "(else the request's `user` field)")
    block_chars: int = Field(256, ge=16, description="prefix: characters per hashed block of the rendered prompt")
    max_blocks: int = Field(200_000, ge=1, description="prefix: block hashes remembered, all replicas together")
    eject_after: int = Field(3, ge=1, description="consecutive failures that eject a replica")
    eject_s: float = Field(2.0, gt=0, description="first ejection's length, in seconds; doubles with each ejection "
                           "in a row")
    max_eject_s: float = Field(60.0, gt=0, description="the longest an ejection lasts, in seconds")
    check_interval_s: float = Field(5.0, ge=0, description="seconds between active health checks and load-signal "
                                    "scrapes (0: off)")


BACKENDS = ("embedded", "openai", "anthropic")


class RequestDefaults(Section):
    """Sampling a request gets from its model where it sets none itself (Ollama's Modelfile PARAMETER, LiteLLM's
    litellm_params): a request's own value always wins."""

    max_tokens: int | None = Field(None, ge=1, description="output tokens at most; null: up to the window")
    temperature: float | None = Field(None, ge=0, le=2, description="sampling temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling mass")
    top_k: int | None = Field(None, ge=0, description="sample from the k likeliest tokens (0: all)")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below this share of the likeliest")
    repetition_penalty: float | None = Field(None, gt=0, description="penalty on tokens already in the context")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="OpenAI's presence penalty")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="OpenAI's frequency penalty")
    stop: list[str] | None = Field(None, description="stop strings")

    def params(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class _ModelSpec(Section):
    """What every model takes, whatever its backend."""

    name: str = Field(description="the name clients ask for in `model`, and routes, keys and tenants list")
    backend: Literal["embedded", "openai", "anthropic"] = Field(description="embedded: tokenomy's own engine runs "
                                                                "a GGUF model; openai: an OpenAI-compatible upstream "
                                                                "server; anthropic: a server that speaks Anthropic's "
                                                                "Messages API")
    price: Price | None = Field(None, description="USD per 1M tokens, for the ledger, budgets and reports; "
                                "default: a packaged model's notional price, else 0")
    defaults: RequestDefaults | None = Field(None, description="sampling a request to this model gets where it "
                                             "sets none (max_tokens, temperature, ...); the request's own wins")

    @model_validator(mode="before")
    @classmethod
    def _fields_of_its_backend(cls, data: Any) -> Any:
        """A setting of the other backend is named as such, not as an unknown field."""
        if isinstance(data, dict):
            for other in _ModelSpec.__subclasses__():
                wrong = sorted(k for k in data if k in other.model_fields and k not in cls.model_fields)
                if wrong:
                    raise ValueError(f"{', '.join(wrong)}: settings of `backend: {other.backend_name()}` models; "
                                     f"this one is {cls.backend_name()}")
        return data

    @classmethod
    def backend_name(cls) -> str:
        return get_args(cls.model_fields["backend"].annotation)[0]


class EmbeddedModelSpec(_ModelSpec):
    """A GGUF model run by tokenomy's engine, in its own process (`backend: embedded`, the default)."""

    backend: Literal["embedded"] = Field("embedded", description="embedded: tokenomy's own engine runs a GGUF "
                                         "model (the default when `backend` is left out)")
    gguf: str | None = Field(None, description="a packaged model's name (smollm2-135m-instruct, gemma3-270m), a "
                             ".gguf path, or a hub model (hf:ORG/REPO:QUANT or hf:ORG/REPO:FILE.gguf, downloaded "
                             "to the Hugging Face cache: docs/models.md); default: `name`, when it is a packaged "
                             "model's")
    engine: EngineConfig | None = Field(None, description="this model's engine settings, key by key over the "
                                        "top-level `engine:` section (keys left out keep its values); null: that "
                                        "section as it is")
    structured: StructuredSettings = Field(StructuredSettings(), description="constrained decoding "
                                           "(response_format json_schema); a packaged model starts from its "
                                           "measured settings")
    preload: bool | None = Field(None, description="load it when tokenomy starts; null: true for the first "
                                 "embedded model only (the others load on their first request)")
    keep_alive: KeepAlive | None = Field(None, description="how long it stays loaded after its last request "
                                         "(Ollama's meaning: a duration, 0 unload once idle, -1 keep); null: "
                                         "fleet.keep_alive")
    discovered: bool = Field(False, description="found by fleet.discover, not configured (set by tokenomy): a "
                             "model memory cannot hold is left out instead of stopping the start")
    pin: bool = Field(False, description="never evicted to make room for another model (an unload by keep_alive "
                      "or the admin API still ends it)")

    @model_validator(mode="after")
    def _check(self) -> EmbeddedModelSpec:
        if self.keep_alive is not None:
            keep_alive_seconds(self.keep_alive)
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
        self.price = self.price or Price()
        return self


class _Upstream(Section):
    """What every upstream server takes, whatever API it speaks: its key, token counting, timeouts and retries."""

    tokenizer: str | None = Field(None, description="what prompt tokens are counted with, before the upstream "
                                  "reports usage: a tiktoken encoding (cl100k_base, o200k_base) or a packaged "
                                  "model's name; default: guessed from `model` (bytes / 4, flagged an estimate, "
                                  "when unknown)")
    timeout_s: float = Field(60.0, gt=0, description="seconds a read from the upstream may take (each chunk of a "
                             "stream)")
    connect_timeout_s: float = Field(5.0, gt=0, description="seconds to open a connection to the upstream")
    max_retries: int = Field(2, ge=0, le=10, description="retries of a request that failed before the upstream "
                             "answered (a pool of several replicas fails over instead)")
    retry_backoff_s: float = Field(0.2, gt=0, description="the wait before the first retry, doubled at each "
                                   "next one and jittered (a Retry-After the upstream sends is waited at least)")
    max_retry_wait_s: float = Field(5.0, gt=0, description="the longest wait before a retry; an upstream's "
                                    "Retry-After longer than this is not waited out: the next model serves, or "
                                    "the client gets it")
    deadline_s: float | None = Field(None, gt=0, description="the most one request may wait for the "
                                     "upstream's first byte, retries included (default: timeout_s)")
    retry_after_send: bool = Field(False, description="also retry a request the upstream may have received (a "
                                   "read timeout or a dropped connection): it may be generated and billed twice")
    schema_policy: Literal["flag", "repair"] = Field("flag", description="an answer that breaks its request's "
                                                     "json_schema: flag (pass it on with x-tokenomy-schema: "
                                                     "invalid) or repair (ask once more, with the problem)")


class OpenAIModelSpec(_Upstream, _ModelSpec):
    """An OpenAI-compatible upstream (vLLM, llama-server, another tokenomy, a hosted API): one server at
    `base_url`, or a pool of `replicas` serving the same model."""

    backend: Literal["openai"] = Field(description="openai: an OpenAI-compatible upstream server")
    base_url: str | None = Field(None, description="the server's API root, e.g. http://host:8000/v1 (or give "
                                 "`replicas`)")
    replicas: list[str] | None = Field(None, description="API roots of several servers of the same model, "
                                       "balanced per `balance` and failed over; instead of `base_url`")
    balance: BalanceSettings = Field(BalanceSettings(), description="how a request picks one of the `replicas`")
    model: str | None = Field(None, description="the model name the upstream knows; default: `name`")
    api_key_env: str | None = Field(None, description="the environment variable holding the upstream's API key "
                                    "(the key itself never goes in the file); null: no key sent")

    @model_validator(mode="after")
    def _check(self) -> OpenAIModelSpec:
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


class AnthropicModelSpec(_Upstream, _ModelSpec):
    """A server that speaks Anthropic's Messages API: Anthropic's own, or any other (vLLM, llama-server, another
    tokenomy). Requests are translated from the internal (OpenAI chat) shape; docs/upstreams.md says how."""

    backend: Literal["anthropic"] = Field(description="anthropic: a server of Anthropic's Messages API")
    base_url: str = Field("https://api.anthropic.com", description="the server's root, as the anthropic SDK's "
                          "base_url (requests go to `base_url`/v1/messages; a trailing /v1 is accepted too)")
    model: str | None = Field(None, description="the model name the upstream knows, e.g. claude-sonnet-4-5; "
                              "default: `name`")
    api_key_env: str | None = Field("ANTHROPIC_API_KEY", description="the environment variable holding the key, "
                                    "sent as a bearer token as the anthropic SDK sends it (the key itself never "
                                    "goes in the file); tokenomy refuses to start while it is unset; null: no key "
                                    "sent (a server that needs none)")
    anthropic_version: str = Field("2023-06-01", description="the anthropic-version header sent")
    max_tokens: int = Field(4096, ge=1, description="max_tokens sent when a request gives none (the Messages API "
                            "requires one)")
    sampling: bool = Field(False, description="send the request's temperature (at most 1), top_p and top_k: "
                           "other Messages servers and older Claude models honour them; Claude models after Opus 4.6 "
                           "refuse them (400), so they are left out unless this is true")
    cache_control: Literal["keep", "auto", "off"] = Field(
        "keep", description="prompt-cache breakpoints: keep, those the client marked (a Messages client's "
        "cache_control); auto, those and, within Anthropic's 4, one at the end of the tools and system prompt and "
        "one at the end of the conversation before its newest user turn; off, none sent")

    @model_validator(mode="after")
    def _check(self) -> AnthropicModelSpec:
        url = self.base_url.rstrip("/")
        self.base_url = url[:-3] if url.endswith("/v1") else url
        self.model = self.model or self.name
        self.price = self.price or Price()
        return self

    def api_key(self) -> str | None:
        """The key from the environment (None when `api_key_env` is null). Read at start, not when the file is
        checked: the variable may be set only where tokenomy serves. ConfigError when it is unset or empty."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ConfigError(f"model {self.name!r} (backend: anthropic) reads its key from ${self.api_key_env}, "
                              "which is not set: export it, or set `api_key_env: null` for a Messages server that "
                              "needs no key")
        return key


def _backend(data: Any) -> str | None:
    if isinstance(data, dict):
        return data.get("backend", "embedded")
    return getattr(data, "backend", None)


ModelSpec = Annotated[Annotated[EmbeddedModelSpec, Tag("embedded")] | Annotated[OpenAIModelSpec, Tag("openai")]
                      | Annotated[AnthropicModelSpec, Tag("anthropic")],
                      Discriminator(_backend, custom_error_type="backend",
                                    custom_error_message="`backend` must be embedded, openai or anthropic")]

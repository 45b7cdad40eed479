"""The one YAML file, validated by pydantic. Every option has a default, so no file at all runs.

Every field carries a description: `tokenomy config docs` renders them into docs/config.md and `tokenomy config
schema` into the JSON Schema editors complete the YAML with (tokenomy/config_docs.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from tokenomy import home
from tokenomy.engine.config import EngineConfig
from tokenomy.models import DEFAULT_MODEL, PACKAGED, PACKAGED_EMBEDDINGS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetLimits(_Strict):
    """Spend limits for one key or tenant, over UTC days and calendar months; any left out is unlimited. A request
    is refused (429) unless its worst case (prompt + output bound, priced) fits beside what is spent and held by
    requests in flight, so concurrent requests never spend past a limit together (meter/budget.py)."""

    usd_per_day: float | None = Field(None, gt=0, description="USD a day (response-cache hits cost nothing); "
                                      "null: no daily USD limit")
    usd_per_month: float | None = Field(None, gt=0, description="USD a calendar month; null: no monthly USD limit")
    tokens_per_day: int | None = Field(None, gt=0, description="billed tokens (prompt + completion of generated "
                                       "answers) a day; null: no daily token limit")
    tokens_per_month: int | None = Field(None, gt=0, description="billed tokens a calendar month; null: no "
                                         "monthly token limit")
    warn_at: float = Field(0.8, gt=0, le=1, description="share of a limit that logs a warning and counts "
                           "tokenomy_budget_warnings_total, once per limit and period")

    def limit(self, unit: str, period: str) -> float | None:
        return getattr(self, f"{unit}_per_{period}")


class Price(_Strict):
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


class StructuredSettings(_Strict):
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


class BalanceSettings(_Strict):
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


class _ModelSpec(_Strict):
    """What every model takes, whatever its backend."""

    name: str = Field(description="the name clients ask for in `model`, and routes, keys and tenants list")
    backend: Literal["embedded", "openai", "anthropic"] = Field(description="embedded: tokenomy's own engine runs "
                                                                "a GGUF model; openai: an OpenAI-compatible upstream "
                                                                "server; anthropic: a server that speaks Anthropic's "
                                                                "Messages API")
    price: Price | None = Field(None, description="USD per 1M tokens, for the ledger, budgets and reports; "
                                "default: a packaged model's notional price, else 0")

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

    @model_validator(mode="after")
    def _check(self) -> EmbeddedModelSpec:
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


class _Upstream(_Strict):
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


class RuleWhen(_Strict):
    """All given conditions must hold for the rule to match; a condition left out (null) always holds."""

    min_prompt_tokens: int | None = Field(None, ge=0, description="the prompt has at least this many tokens")
    max_prompt_tokens: int | None = Field(None, ge=0, description="the prompt has at most this many tokens")
    regex: str | None = Field(None, description="a Python regular expression searched in the last user message")
    keywords: list[str] | None = Field(None, description="any of them, case-insensitive, in the last user message")
    has_tools: bool | None = Field(None, description="the request offers tools (true) or none (false)")
    has_response_format: bool | None = Field(None, description="the request asks for JSON (response_format) or "
                                             "not")
    tenant: str | None = Field(None, description="the caller's key belongs to this tenant")
    metadata: dict[str, str] | None = Field(None, description="each key's request header x-tokenomy-meta-<key> "
                                            "has this value")

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
    """One rule of the `rules` strategy: the first rule whose conditions hold picks the model."""

    when: RuleWhen = Field(description="the conditions, all of which must hold")
    model: str = Field(description="a configured model the matching request goes to")


class CascadeSettings(_Strict):
    """The `cascade` strategy: the cheapest model answers first and the answer goes up to the next model when any
    signal below fails (router/cascade.py; `tokenomy router floors` picks the logprob floors from data)."""

    min_mean_logprob: float = Field(-1.0, description="escalate when the answer's mean token log-probability "
                                    "(nats) is below this; lower: fewer escalations")
    min_token_logprob: float = Field(-9.0, description="... or when any single token's log-probability is below "
                                     "this")
    escalate_on_invalid_json: bool = Field(True, description="escalate an answer that is not valid JSON (or breaks "
                                           "its schema) when the request asked for JSON")
    escalate_on_empty: bool = Field(True, description="escalate an empty answer")
    escalate_on_refusal: bool = Field(True, description="escalate an answer that opens with a refusal (\"I'm "
                                      "sorry\", \"I cannot help\")")
    escalate_on_truncated: bool = Field(True, description="escalate an answer cut by max_tokens "
                                        "(finish_reason length)")
    stream_buffer_tokens: int = Field(24, ge=1, description="streams: tokens judged before the first byte is sent "
                                      "(later ones are not judged); more: better judgement, later first token")


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
    """The `classifier` strategy: a learned router predicts whether the cheaper model's answer will do."""

    path: str = Field(description="a router file from `tokenomy router train`")
    threshold: float | None = Field(None, ge=0, le=1, description="send to the cheaper model when its predicted "
                                    "probability of a good answer is at least this; null: the threshold the file "
                                    "was calibrated with")


class LoadSettings(_Strict):
    """The `load` strategy: skip to a cheaper model while the preferred one is queued up."""

    slo_queue_s: float = Field(1.0, gt=0, description="seconds: preferred model's expected queue wait above this "
                               "-> the first cheaper model whose wait is not")


class CompactionSettings(_Strict):
    """Compaction of conversation history (tokenomy/context/compaction.py)."""

    trigger_tokens: int = Field(ge=64, description="compact when the prompt passes this many tokens")
    keep_last_turns: int = Field(4, ge=1, description="the last turns are never touched")
    strategy: Literal["drop_middle", "summarize"] = Field(
        "drop_middle", description="drop_middle: replace the oldest turns by a note that they were left out; "
        "summarize: by a summary that `summary_model` writes (it costs a generation)")
    summary_model: str | None = Field(None, description="summarize: a configured model (a cheap one) that writes "
                                      "the summary")
    max_summary_tokens: int = Field(256, ge=16, le=4096, description="summarize: the summary's max_tokens")
    mask_tool_outputs: bool = Field(False, description="first replace old tool results by a short note, before "
                                    "dropping turns")
    block_turns: int | None = Field(None, ge=1, description="turns replaced at a time (default keep_last_turns), "
                                    "so the compacted prefix stays the same for a while and prefix caches hit")

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
        default_factory=lambda: ["system", "question", "code"], description="parts never compressed: the system "
        "prompt, the question (the last user message's last paragraph), code blocks")
    model: str = Field(DEFAULT_MODEL, description="the small model whose token surprisal decides what stays "
                       "(a packaged model or a .gguf path)")

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value not in PACKAGED and not value.endswith(".gguf") and not value.startswith("hf:"):
            raise ValueError(f"compress.model must be a packaged model ({', '.join(PACKAGED)}), a .gguf path or "
                             "a hub model (hf:ORG/REPO:QUANT)")
        return value


class ContextSettings(_Strict):
    """The context stage's levers for one route; all off by default."""

    compaction: CompactionSettings | None = Field(None, description="compact long conversations; null: off")
    compress: CompressSettings | None = Field(None, description="compress long messages; null: off")
    lint: bool = Field(False, description="prompt-layout lint: report what breaks prefix caching (also on per "
                       "request with header x-tokenomy-lint: on)")
    rewrite: bool = Field(False, description="lint's safe fix: move date/time lines of the system prompt to the "
                          "end, so the prefix before them caches")
    fit: Literal["auto", "on", "off"] = Field(
        "auto", description="fit a request into the serving model's window (tools described briefly, the oldest "
        "turns dropped, then max_tokens lowered to the room left: tokenomy/context/fit.py). auto: for the Messages "
        "and Responses APIs, whose agent clients send long prompts and a large max_tokens whatever the model; on: "
        "every request; off: never (a request that does not fit is a 400)")
    fit_min_answer: int = Field(1024, ge=16, description="fitting stops once the prompt leaves this many tokens of "
                                "the window for the answer")


Strategy = Literal["fixed", "rules", "classifier", "load", "cascade", "token"]


class RouteSpec(_Strict):
    """A name clients ask for that picks one of several models per request. Candidate models cheapest first.
    Strategies compose in this order: rules, classifier, load, cascade; `token` (token-level routing) stands
    alone."""

    strategy: Strategy | list[Strategy] = Field("fixed", description="fixed (always the first model), rules, "
                                                "classifier, load, cascade, or a list of them; token alone")
    models: list[str] = Field(min_length=1, description="configured models, cheapest first")
    context_budget: int | None = Field(None, ge=1, description="prompt tokens a request should stay under; one "
                                       "over it is counted as over budget in its row (a 400 with `enforce`); "
                                       "null: no budget")
    enforce: bool = Field(False, description="refuse (400) a prompt over context_budget instead of only "
                         "counting it")
    context: ContextSettings = Field(ContextSettings(), description="compaction, compression and lint for this "
                                     "route")
    rules: list[RuleSpec] = Field(default_factory=list, description="strategy rules: tried in order, the first "
                                  "that matches picks the model")
    classifier: ClassifierSettings | None = Field(None, description="strategy classifier: the router file")
    load: LoadSettings = Field(LoadSettings(), description="strategy load: the queue-wait objective")
    cascade: CascadeSettings = Field(CascadeSettings(), description="strategy cascade: when to escalate")
    token: TokenRouteSettings = Field(TokenRouteSettings(), description="strategy token: the hand-over rule")

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
    """A model that keeps failing is skipped for a while; routing falls back to the route's other models."""

    failures: int = Field(3, ge=1, description="failures within window_s that cool a model down")
    window_s: float = Field(60.0, gt=0, description="seconds over which failures are counted")
    cooldown_s: float = Field(30.0, gt=0, description="seconds a cooled-down model is skipped")


class KeySpec(_Strict):
    """An API key: with any keys configured, every request needs one (server.public paths aside)."""

    key: str | None = Field(None, description="the key in plain text (hashed at load) ...")
    key_sha256: str | None = Field(None, description="... or its sha256 in hex, so the file holds no key")
    name: str = Field("key", description="a label for logs and rate-limit errors")
    tenant: str = Field("default", description="the tenant the key's spend and rows count for")
    admin: bool = Field(False, description="may call /admin/keys, /admin/reload and the dashboard, and "
                       "rate any request's answer")
    rpm: int | None = Field(None, ge=1, description="requests per minute; null: unlimited")
    tpm: int | None = Field(None, ge=1, description="tokens per minute; null: unlimited")
    budget: BudgetLimits | None = Field(None, description="this key's spend limits; null: none")
    models: list[str] | None = Field(None, description="model and route names this key may ask for; null: all")

    @model_validator(mode="after")
    def _one(self) -> KeySpec:
        if bool(self.key) == bool(self.key_sha256):
            raise ValueError(f"key {self.name!r}: give exactly one of `key` or `key_sha256`")
        return self


class ExactCacheSettings(_Strict):
    """Answers to byte-identical requests (tokenomy/cache/exact.py)."""

    enabled: bool = Field(True, description="serve repeated requests from the cache")
    ttl_s: float = Field(86400.0, gt=0, description="seconds an answer stays servable")
    max_entries: int = Field(10000, ge=1, description="answers kept; the least recently used go first")
    deterministic_only: bool = Field(True, description="only cache temperature 0 or seeded requests (the others "
                                     "asked for randomness); the semantic cache follows it too")


class SemanticCacheSettings(_Strict):
    """Answers to paraphrased questions, by embedding similarity with a learned verifier (docs/cache.md)."""

    enabled: bool = Field(True, description="serve near-duplicate questions from the cache")
    threshold: float = Field(0.9, gt=0, le=1, description="the least cosine similarity of a question to a stored "
                             "one to be a candidate hit")
    error_budget: float | None = Field(0.02, gt=0, lt=1, description="tolerated share of wrong hits: the verifier "
                                       "serves a candidate only above the score that keeps wrong hits under it; "
                                       "null: the threshold alone")
    ttl_s: float = Field(86400.0, gt=0, description="seconds an answer stays servable")
    max_entries: int = Field(100000, ge=1, description="answers kept; the least recently used go first")
    routes: list[str] | None = Field(None, description="models and routes allowed to use it; null: all")
    embed_threads: int = Field(1, ge=1, le=64, description="threads for the MiniLM embedding of a lookup")
    min_margin: float = Field(0.02, ge=0, lt=1, description="serve only when the best stored question beats the "
                              "next one by this much cosine (an ambiguous pair of candidates is a miss)")
    explore: float = Field(0.0, ge=0, le=1, description="online error control (docs/cache.md): the least share of "
                           "would-be hits sent to the model anyway and compared, to keep error_budget on live "
                           "traffic (all of them until the cache has evidence); 0: the calibration alone")
    explore_window: int = Field(100, ge=5, description="memory of online error control: an explore outcome weighs "
                                "e^(-age / explore_window), age in outcomes observed since")

    @model_validator(mode="after")
    def _explore(self) -> SemanticCacheSettings:
        if self.explore > 0 and self.error_budget is None:
            raise ValueError("cache.semantic.explore keeps an error budget online: set error_budget too")
        return self


class CacheSettings(_Strict):
    """The response caches, in front of every model."""

    path: str | None = Field(None, description="directory of the caches' SQLite files and ANN index; null: cache/ "
                             "in the data directory ($TOKENOMY_HOME, else $XDG_DATA_HOME/tokenomy, else "
                             "~/.local/share/tokenomy)")
    store: str = Field("local", description="where cached answers live: local (SQLite under `path`) or "
                       "redis://host:port/db (shared by gateway replicas)")
    exact: ExactCacheSettings = Field(ExactCacheSettings(), description="the exact-match cache")
    semantic: SemanticCacheSettings = Field(SemanticCacheSettings(), description="the semantic cache")

    @model_validator(mode="after")
    def _store(self) -> CacheSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("cache.store must be 'local' or a redis:// URL")
        return self

    def directory(self) -> Path:
        """Where the caches' local files go: `path`, or the data directory's cache/."""
        return Path(self.path).expanduser() if self.path else home.cache_path()


class LimitsSettings(_Strict):
    """Where rate limits, budget spend and the holds of requests in flight are counted: `local` (this process) or
    a Redis that every gateway replica shares. What happens while Redis does not answer: `open` admits unchecked,
    `closed` refuses (503). Before a request reaches a backend its worst case is held against every budget and
    tpm limit that applies (pipeline/reserve.py); the record replaces the hold by what it used."""

    store: str = Field("local", description="local (this process) or redis://host:port/db (all replicas)")
    rates_on_store_down: Literal["open", "closed"] = Field("open", description="rate limits while Redis does not "
                                                           "answer: open admits, closed refuses (503)")
    budgets_on_store_down: Literal["open", "closed"] = Field("closed", description="budgets while Redis does not "
                                                             "answer: open admits unchecked, closed refuses (503)")
    timeout_s: float = Field(0.25, gt=0, description="Redis socket timeout, in seconds")
    lease_s: float = Field(300.0, ge=3, description="seconds a request's budget and tpm hold outlives its last "
                           "renewal (a live gateway renews every lease_s/3): what a gateway killed while serving "
                           "holds is freed after this")
    reserve_output_tokens: int = Field(4096, gt=0, description="output bound reserved for a request with no "
                                       "max_tokens on a model whose window tokenomy does not know (an upstream), "
                                       "then sent as its max_tokens so the bound holds")
    allowances: bool = Field(True, description="with a Redis store, while a budget is far from its limit each "
                             "gateway holds a chunk of it (a leased allowance) and admits requests against it "
                             "without a round trip to Redis; near the limit every request is held in Redis")
    shrink_to_fit: bool = Field(False, description="a request whose output bound does not fit a token or USD "
                                "budget is served with the largest max_tokens that fits (header "
                                "x-tokenomy-max-tokens) instead of a 429")

    @model_validator(mode="after")
    def _store(self) -> LimitsSettings:
        if self.store != "local" and not self.store.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("limits.store must be 'local' or a redis:// URL")
        return self


class EnergySettings(_Strict):
    """Joules per request, for the ledger's tokens-per-joule (meter/energy.py)."""

    source: Literal["auto", "nvml", "rapl", "estimate"] = Field(
        "auto", description="nvml (NVIDIA GPUs), rapl (Intel/AMD CPU counters), estimate (busy cores x "
        "watts_per_core), or auto: the first of these that works")
    watts_per_core: float = Field(15.0, gt=0, description="CPU estimate: watts per busy core")


class TelemetrySettings(_Strict):
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


class TenantSpec(_Strict):
    """Limits shared by all keys of one tenant."""

    budget: BudgetLimits | None = Field(None, description="the tenant's spend limits, all its keys together; "
                                        "null: none")
    models: list[str] | None = Field(None, description="model and route names the tenant's keys may ask for; "
                                     "null: all")


class LedgerSettings(_Strict):
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


class BatchSettings(_Strict):
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
    poll_s: float = Field(0.5, gt=0, description="seconds between looks for new batch work when none woke the "
                          "runner")
    drain_s: float = Field(10.0, ge=0, description="at shutdown, how long in-flight batch requests may finish")
    lease_s: float = Field(60.0, gt=0, description="gateways sharing a database: a batch request one of them "
                           "started is its own for this long, renewed while it runs; if that gateway dies, another "
                           "runs the request after this")


class ServerSettings(_Strict):
    """The HTTP server (`tokenomy serve --host/--port` override these)."""

    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 for every interface")
    port: int = Field(8000, ge=1, le=65535, description="port to bind")
    max_body_bytes: int = Field(4 << 20, ge=1024, description="the largest request body, in bytes (413 above)")
    public: list[str] = Field(default_factory=lambda: ["/health"], description="with keys configured, these paths "
                              "answer without one; /metrics, /docs and /openapi.json need any valid key unless "
                              "listed (a Prometheus scrape can send one as a bearer token)")
    workers: int = Field(1, ge=1, le=256, description="API processes on the port, each running the whole pipeline, "
                         "in front of one engine process per embedded model (docs/workers.md); more than 1 needs "
                         "limits.store on Redis when keys or tenants have limits or budgets")


class Config(_Strict):
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


class ConfigError(ValueError):
    pass


def _yaml_path(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as a path in the file: the backend tag pydantic puts after `models.N` is
    not a key of the file."""
    keys = [x for i, x in enumerate(loc) if not (i == 2 and loc[0] == "models" and x in BACKENDS)]
    return ".".join(str(x) for x in keys) or "(top level)"


def model_entry(ref: str) -> dict[str, Any]:
    """A model named on the command line -> its `models:` entry: `NAME=REF` names it; a packaged model is served
    under its name, a .gguf path under its file's stem, a hub model as ORG/REPO:QUANT (tokenomy/hub.py)."""
    from tokenomy import hub

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


def load_config(path: str | Path | None, models: list[str] | None = None) -> Config:
    """Read and validate the YAML file (safe_load only: no tags execute), with `models` named on the command line
    (with_models). None -> defaults."""
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

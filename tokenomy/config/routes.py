"""The file's `routes:` (strategies, rules, cascade, token-level, classifier, load) and their context settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tokenomy.config.section import Section
from tokenomy.models.catalog import DEFAULT_MODEL, PACKAGED

Strategy = Literal["fixed", "rules", "classifier", "load", "cascade", "token"]


class RuleWhen(Section):
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


class RuleSpec(Section):
    """One rule of the `rules` strategy: the first rule whose conditions hold picks the model."""

    when: RuleWhen = Field(description="the conditions, all of which must hold")
    model: str = Field(description="a configured model the matching request goes to")


class CascadeSettings(Section):
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


class TokenRouteSettings(Section):
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


class ClassifierSettings(Section):
    """The `classifier` strategy: a learned router predicts whether the cheaper model's answer will do."""

    path: str = Field(description="a router file from `tokenomy router train`")
    threshold: float | None = Field(None, ge=0, le=1, description="send to the cheaper model when its predicted "
                                    "probability of a good answer is at least this; null: the threshold the file "
                                    "was calibrated with")


class LoadSettings(Section):
    """The `load` strategy: skip to a cheaper model while the preferred one is queued up."""

    slo_queue_s: float = Field(1.0, gt=0, description="seconds: preferred model's expected queue wait above this "
                               "-> the first cheaper model whose wait is not")


class CompactionSettings(Section):
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


class CompressSettings(Section):
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


class ContextSettings(Section):
    """The context stage's levers for one route; all off by default."""

    compaction: CompactionSettings | None = Field(None, description="compact long conversations; null: off")
    compress: CompressSettings | None = Field(None, description="compress long messages; null: off")
    lint: bool = Field(False, description="prompt-layout lint: report what breaks prefix caching (also on per "
                       "request with header x-tokenomy-lint: on)")
    rewrite: bool = Field(False, description="lint's safe fix: move date/time lines of the system prompt to the "
                          "end, so the prefix before them caches")
    fit: Literal["auto", "on", "off"] = Field(
        "auto", description="fit a request into the serving model's window (tools described briefly, the oldest "
        "turns dropped, then max_tokens lowered to the room left: tokenomy/context/window.py). auto: for the Messages "
        "and Responses APIs, whose agent clients send long prompts and a large max_tokens whatever the model; on: "
        "every request; off: never (a request that does not fit is a 400)")
    fit_min_answer: int = Field(1024, ge=16, description="fitting stops once the prompt leaves this many tokens of "
                                "the window for the answer")


class RouteSpec(Section):
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


class CooldownSettings(Section):
    """A model that keeps failing is skipped for a while; routing falls back to the route's other models."""

    failures: int = Field(3, ge=1, description="failures within window_s that cool a model down")
    window_s: float = Field(60.0, gt=0, description="seconds over which failures are counted")
    cooldown_s: float = Field(30.0, gt=0, description="seconds a cooled-down model is skipped")

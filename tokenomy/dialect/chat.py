"""OpenAI request bodies. Unknown fields are ignored (as vLLM does), known ones are type-checked strictly, as
OpenAI checks them: "8" is not a number, "yes" and 1 are not booleans (an int still passes for a float).

A body becomes the pipeline's internal request in one place, `gen_request`, for the HTTP routes and the batch
worker alike; a body that does not validate gets the 400 `body_error` says."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tokenomy.config import keep_alive_seconds
from tokenomy.dialect.json_input import check_json
from tokenomy.errors import APIError
from tokenomy.generation import MAX_MESSAGES, MAX_OUTPUT_TOKENS, GenRequest

MAX_CHOICES = 16       # n and best_of at most: each choice is a sequence of its own on the engine


class _ChatBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_ChatBody):
    include_usage: bool = False


class ChatMessage(_ChatBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content(self) -> ChatMessage:
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"content part of type {part.get('type')!r} is not supported; "
                                     "only text parts are")
                texts.append(part["text"])
            self.content = "".join(texts)
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def plain(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                             "content": self.content or ""}
        if self.name:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


class _Sampling(_ChatBody):
    model: str
    max_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = None
    # vLLM-style extras (ride in extra_body)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool | None = None
    speculative: bool | None = None          # false: no speculative drafts for this request
    keep_alive: str | int | float | None = None   # Ollama's: how long the model stays loaded after this request

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str | int | float | None) -> str | int | float | None:
        if v is not None:
            keep_alive_seconds(v)       # ValueError (a 400) naming it
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k, b in (v or {}).items():
            if not k.lstrip("-").isdigit() or int(k) < 0:
                raise ValueError(f"logit_bias keys must be token ids, got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError("logit_bias values must be between -100 and 100")
        return v

    def sampling(self) -> dict[str, Any]:
        keys = ("max_tokens", "temperature", "top_p", "stop", "presence_penalty", "frequency_penalty",
                "logit_bias", "seed", "top_k", "min_p", "repetition_penalty", "ignore_eos",
                "speculative", "keep_alive")
        d = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.n > 1:
            d["n"] = self.n
        return d


class PredictedOutput(_ChatBody):
    """OpenAI's Predicted Outputs: the text the answer is expected to be (a string, or text parts)."""

    type: Literal["content"]
    content: str | list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _text(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(v, list):
            for part in v:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"content part of type {part.get('type')!r} is not supported; only text parts "
                                     "are")
            return "".join(part["text"] for part in v)
        return v


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    prediction: PredictedOutput | None = None     # drafted from by the embedded engine; passed on to an upstream

    @model_validator(mode="after")
    def _chat(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None and self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice is only allowed when tools are specified")
        return self

    def gen_request(self, priority: str = "interactive") -> GenRequest:
        return GenRequest(model=self.model, kind="chat", messages=[m.plain() for m in self.messages],
                          params=self.sampling(), tools=self.tools, tool_choice=self.tool_choice,
                          response_format=self.response_format, user=self.user, priority=priority)

    def sampling(self) -> dict[str, Any]:
        d = super().sampling()
        if self.parallel_tool_calls is not None:
            d["parallel_tool_calls"] = self.parallel_tool_calls
        if self.logprobs:
            d["logprobs"] = True
            d["top_logprobs"] = self.top_logprobs or 0
        if self.prediction is not None:
            d["prediction"] = {"type": "content", "content": self.prediction.content}
        return d


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and v < n:
            raise ValueError(f"best_of ({v}) must be at least n ({n})")
        if v is not None and v > n and info.data.get("stream"):
            raise ValueError("best_of greater than n cannot be streamed: every candidate must finish before the "
                             "best are chosen")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list):
            if len(v) != 1 or not isinstance(v[0], str):
                raise ValueError("prompt must be a string (batched or token-id prompts are not supported)")
        if (v if isinstance(v, str) else v[0]) == "":
            raise ValueError("prompt must not be empty")
        return v

    def gen_request(self, priority: str = "interactive") -> GenRequest:
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        return GenRequest(model=self.model, kind="completion", api="completions", prompt=self.text,
                          params=self.sampling(), user=self.user, priority=priority)

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else str(self.prompt[0])

    def sampling(self) -> dict[str, Any]:
        d = super().sampling()
        if d.get("max_tokens") is None:
            d["max_tokens"] = 16        # OpenAI's legacy default
        if self.logprobs is not None:
            d["logprobs"] = True
            d["top_logprobs"] = self.logprobs
        if self.best_of is not None and self.best_of > self.n:
            d["best_of"] = self.best_of
        return d


BODIES: dict[str, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


def body_error(errors: list[Any]) -> APIError:
    """The 400 for a body that does not validate (pydantic's `errors()`), naming the first field at fault."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        msg = "We could not parse the JSON body of your request: " + str(first.get("ctx", {}).get("error", ""))
        return APIError(400, msg.strip(), code="invalid_json")
    if first.get("type") == "model_attributes_type" or (not loc and first.get("type") == "dict_type"):
        return APIError(400, "The request body must be a JSON object.", code="invalid_body")
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = f"Missing required parameter: '{param}'."
    elif param:
        msg = f"Invalid value for '{param}': {msg}"
    return APIError(400, msg, param=param, code="invalid_value")


def gen_request(endpoint: str, body: dict[str, Any], priority: str = "interactive") -> GenRequest:
    """The internal request for a body sent to `endpoint` (a key of BODIES), not streamed; an APIError 400 when it
    does not validate, or holds what no body read over HTTP may (json_input.check_json: a stored batch line from
    before that check, say)."""
    check_json(body, "The body")
    try:
        req = BODIES[endpoint].model_validate({**body, "stream": False})
    except ValidationError as e:
        raise body_error(e.errors()) from None
    return req.gen_request(priority)

"""Ollama's API request bodies (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`, `/api/show`,
`/api/pull`, `/api/delete`) and their one mapping to the pipeline's internal request (docs/ollama.md).

As Ollama does, unknown fields and unknown `options` are ignored and `stream` defaults to true. Known fields are
type-checked (an int passes for a float). A body that does not validate gets the 400 `body_error` says.

The mapping: `options` become the engine's sampling (num_predict -> max_tokens, repeat_penalty ->
repetition_penalty; num_ctx is accepted: the window is the loaded model's); `format: "json"` is a json_object
response format and a JSON schema a json_schema one, both decoded under tokenomy's grammar; tools are OpenAI's
shape already; an assistant turn's `tool_calls` (arguments as an object) become OpenAI tool calls with ids, and
each `tool` turn answers the earliest call not yet answered. `/api/generate` is a chat turn (`system`, then the
prompt) unless `raw`, which sends the prompt as it is; a `suffix` is fill in the middle, the prompt framed by the
model's FIM tokens (the caller checks the model has them). `think` is accepted (no model served here thinks
apart from its answer); `keep_alive` is checked here and goes to the fleet in the request's params.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tokenomy.config import keep_alive_seconds
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest

LATEST = ":latest"
NO_IMAGES = "images are not supported: the models tokenomy serves read text only"


class _OllamaBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SamplingOptions(BaseModel):
    """The `options` tokenomy's engine honours; any other option is ignored, as Ollama ignores one it does not
    know (num_gpu, num_thread, mirostat ... belong to a runner tokenomy does not have)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: list[str] | str | None = None
    num_predict: int | None = None
    num_ctx: int | None = Field(None, ge=0)
    repeat_penalty: float | None = Field(None, ge=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def sampling(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.temperature is not None:
            d["temperature"] = min(self.temperature, 2.0)
        if self.top_p is not None and self.top_p > 0:
            d["top_p"] = self.top_p
        for key in ("top_k", "min_p", "seed", "presence_penalty", "frequency_penalty"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.repeat_penalty is not None and self.repeat_penalty > 0:
            d["repetition_penalty"] = self.repeat_penalty
        stops = [self.stop] if isinstance(self.stop, str) else [s for s in (self.stop or []) if s]
        if stops:
            d["stop"] = stops
        if self.num_predict is not None and self.num_predict > 0:     # -1: no limit, -2: fill the window
            d["max_tokens"] = self.num_predict
        return d


class ToolCallFunction(_OllamaBody):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class ToolCall(_OllamaBody):
    id: str | None = None
    function: ToolCallFunction


class OllamaMessage(_OllamaBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Generating(_OllamaBody):
    model: str = Field(min_length=1)
    format: str | dict[str, Any] | None = None
    options: SamplingOptions | None = None
    stream: bool = True
    keep_alive: str | int | float | None = None
    think: bool | Literal["high", "medium", "low"] | None = None

    @field_validator("format")
    @classmethod
    def _format(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("", "json"):
            raise ValueError("format must be \"json\" or a JSON schema object")
        return v

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str | int | float | None) -> str | int | float | None:
        if v is not None:
            keep_alive_seconds(v)
        return v

    def response_format(self) -> dict[str, Any] | None:
        if self.format == "json":
            return {"type": "json_object"}
        if isinstance(self.format, dict) and self.format:
            return {"type": "json_schema", "json_schema": {"name": "output", "schema": self.format, "strict": True}}
        return None

    def sampling(self) -> dict[str, Any]:
        """The engine's sampling, and keep_alive for the fleet (backends/fleet.py)."""
        d = self.options.sampling() if self.options is not None else {}
        if self.keep_alive is not None:
            d["keep_alive"] = self.keep_alive
        return d


class ChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    # tokenomy's extension (Ollama has none): OpenAI's tool_choice, "auto" (the default), "required", "none"
    tool_choice: Literal["auto", "required", "none"] | None = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(v or []):
            fn = tool.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ValueError(f"tools[{i}] needs a function with a name")
            if "parameters" in fn and not isinstance(fn["parameters"], dict):
                raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        return v

    @model_validator(mode="after")
    def _text_only(self) -> ChatRequest:
        if any(m.images for m in self.messages):
            raise ValueError(NO_IMAGES)
        return self

    def internal_messages(self) -> list[dict[str, Any]]:
        """The conversation as OpenAI-chat messages: an assistant's calls get ids (their own, else call_N), and a
        tool turn answers the call its tool_call_id names, else the earliest unanswered call of its tool_name,
        else the earliest unanswered call."""
        out: list[dict[str, Any]] = []
        open_calls: list[tuple[str, str]] = []        # (id, tool name), not yet answered
        n = 0
        for m in self.messages:
            msg: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.role == "assistant" and m.tool_calls:
                calls = []
                for call in m.tool_calls:
                    call_id = call.id or f"call_{n}"
                    n += 1
                    open_calls.append((call_id, call.function.name))
                    calls.append({"id": call_id, "type": "function", "function": {
                        "name": call.function.name,
                        "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
                msg["tool_calls"] = calls
            elif m.role == "tool":
                match = next((c for c in open_calls if c[0] == m.tool_call_id), None) or \
                    next((c for c in open_calls if c[1] == m.tool_name), None) or \
                    (open_calls[0] if open_calls else None)
                if match is not None:
                    open_calls.remove(match)
                msg["tool_call_id"] = match[0] if match else (m.tool_call_id or f"call_{n}")
                if m.tool_name:
                    msg["name"] = m.tool_name
            out.append(msg)
        return out

    def gen_request(self, model: str) -> GenRequest:
        """The internal request for the served model `model` (the client's name resolved: api/ollama.py)."""
        return GenRequest(model=model, kind="chat", api="ollama.chat", messages=self.internal_messages(),
                          params=self.sampling(), tools=self.tools or None,
                          tool_choice=self.tool_choice if self.tools else None,
                          response_format=self.response_format())


class GenerateRequest(_Generating):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None

    @model_validator(mode="after")
    def _refusals(self) -> GenerateRequest:
        if self.template:
            raise ValueError("template (a Go template) is not supported: the model's own chat template from its "
                             "GGUF is used; send raw: true with the prompt already formatted instead")
        if self.images:
            raise ValueError(NO_IMAGES)
        if (self.raw or self.suffix) and self.response_format() is not None:
            raise ValueError("format is decoded under the chat template's turn: it cannot be combined with raw or "
                             "suffix")
        if self.context:
            raise ValueError("context (the token ids of an earlier answer) is not supported: send the "
                             "conversation to /api/chat instead")
        return self

    def gen_request(self, model: str, fim: tuple[str, str, str] | None = None) -> GenRequest:
        """The internal request for the served model `model`; `fim`: the model's (prefix, suffix, middle) tokens,
        which a request with a suffix needs."""
        params = self.sampling()
        fmt = self.response_format()
        if self.suffix:
            assert fim is not None
            prompt = f"{fim[0]}{self.prompt}{fim[1]}{self.suffix}{fim[2]}"
            return GenRequest(model=model, kind="completion", api="ollama.generate", prompt=prompt, params=params)
        if self.raw:
            return GenRequest(model=model, kind="completion", api="ollama.generate", prompt=self.prompt,
                              params=params)
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": self.prompt}]
        return GenRequest(model=model, kind="chat", api="ollama.generate", messages=messages, params=params,
                          response_format=fmt)


class EmbedRequest(_OllamaBody):
    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v: str | list[str]) -> str | list[str]:
        texts = [v] if isinstance(v, str) else v
        if not texts:
            raise ValueError("input must not be empty")
        if any(t == "" for t in texts):
            raise ValueError("input must not hold an empty string")
        return v

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str | int | float | None) -> str | int | float | None:
        if v is not None:
            keep_alive_seconds(v)
        return v

    def gen_request(self, model: str, api: str = "ollama.embed") -> GenRequest:
        params: dict[str, Any] = {"encoding_format": "float"}
        if self.dimensions is not None:
            params["dimensions"] = self.dimensions
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        return GenRequest(model=model, kind="embedding", api=api, inputs=texts, params=params, stream=False)


class EmbeddingsRequest(_OllamaBody):
    """The older `/api/embeddings`: one `prompt`, one `embedding` back."""

    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    options: dict[str, Any] | None = None
    keep_alive: str | int | float | None = None

    def gen_request(self, model: str) -> GenRequest:
        return EmbedRequest(model=self.model, input=self.prompt).gen_request(model, api="ollama.embeddings")


def error_body(err: APIError) -> dict[str, Any]:
    return {"error": err.message}


class _Named(_OllamaBody):
    """A body that names a model as `model` (or, in older clients, `name`)."""

    model: str = ""
    name: str = ""

    @model_validator(mode="after")
    def _named(self) -> _Named:
        self.model = self.model or self.name
        if not self.model:
            raise ValueError("model is required")
        return self


class ShowRequest(_Named):
    verbose: bool = False


class PullRequest(_Named):
    insecure: bool = False
    stream: bool = True


class DeleteRequest(_Named):
    pass


def body_error(errors: list[Any]) -> APIError:
    """The 400 for a body that does not validate (pydantic's `errors()`): "<field>: <message>"."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(400, "The request body must be a JSON object.", code="invalid_body")
    path = ".".join(loc)
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        msg = f"{path} is required"
        return APIError(400, msg, param=path or None, code="invalid_value")
    return APIError(400, f"{path}: {msg}" if path else msg, param=path or None, code="invalid_value")

"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`) and their one mapping to
the pipeline's internal request. Known fields are type-checked strictly, as the OpenAI bodies are
(dialect/chat.py); unknown ones are ignored, and so are the fields no model here can honour (IGNORED, listed in
docs/api.md). A body that does not validate gets the 400 `body_error` says, worded as Anthropic words it
("max_tokens: Field required").

The mapping (docs/api.md, "Anthropic Messages"): `system` becomes the system message; text blocks of a turn are
joined by a blank line; `tool_use` blocks become the assistant's OpenAI `tool_calls` (input as JSON arguments),
`tool_result` blocks become `tool` messages; `thinking` blocks are dropped; a `cache_control` on any block of a
turn (or on a tool) stays on the internal message (or tool) as `cache_control`, a cache breakpoint at its end.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from tokenomy.errors import APIError
from tokenomy.generation import MAX_MESSAGES, MAX_OUTPUT_TOKENS, GenRequest

# Accepted and ignored: what a model served here cannot honour (extended thinking, server-side context editing,
# effort, tiers, containers and skills, MCP servers run by the API, geography).
IGNORED = ("thinking", "context_management", "output_config.effort", "service_tier", "container", "mcp_servers",
           "inference_geo", "speed", "diagnostics", "user_profile_id", "workspace_id")
MEDIA_BLOCKS = ("image", "document")


class _MessagesBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def _text_blocks(value: Any) -> Any:
    """A plain string is shorthand for one text block (and null for none)."""
    if value is None:
        return []
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class TextBlock(_MessagesBody):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class MediaBlock(_MessagesBody):
    """An image or a document: refused (every model served here reads text only), named in the error."""

    type: Literal["image", "document"]
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(_MessagesBody):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


ResultPart = Annotated[TextBlock | MediaBlock, Field(discriminator="type")]


class ToolResultBlock(_MessagesBody):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: Annotated[list[ResultPart], BeforeValidator(_text_blocks)] = Field(default_factory=list)
    is_error: bool = False
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        text = "\n\n".join(p.text for p in self.content if isinstance(p, TextBlock))
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_MessagesBody):
    """Extended thinking from an earlier turn (with its signature): dropped, no model here continues it."""

    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | MediaBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
                  Field(discriminator="type")]


class Message(_MessagesBody):
    # "system": a system message inside the conversation, as Claude Code (2.1.3xx) sends one after the user's
    # turn with the session's environment; text blocks only, kept in its place as a system message
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[Block], BeforeValidator(_text_blocks)]

    @model_validator(mode="after")
    def _blocks(self) -> Message:
        for block in self.content:
            if self.role == "system" and not isinstance(block, TextBlock):
                raise ValueError("a system message holds text blocks only")
            if self.role == "user" and isinstance(block, ToolUseBlock):
                raise ValueError("tool_use blocks belong in assistant messages")
            if self.role == "assistant" and isinstance(block, ToolResultBlock):
                raise ValueError("tool_result blocks belong in user messages")
        return self

    def internal(self) -> list[dict[str, Any]]:
        """This turn as OpenAI-chat-shaped messages: a user turn's tool results become `tool` messages (in the
        order sent), its text one user message; an assistant turn one message with its tool calls."""
        out: list[dict[str, Any]] = []
        texts: list[str] = []
        marker: dict[str, Any] | None = None

        def flush(role: str, calls: list[dict[str, Any]] | None = None) -> None:
            nonlocal marker
            if texts or calls:
                msg: dict[str, Any] = {"role": role, "content": "\n\n".join(texts)}
                if calls:
                    msg["tool_calls"] = calls
                out.append(_marked(msg, marker))
            texts.clear()
            marker = None

        calls: list[dict[str, Any]] = []
        for block in self.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
                marker = block.cache_control or marker
            elif isinstance(block, ToolResultBlock):
                flush("user")
                out.append(_marked({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()},
                                   block.cache_control))
            elif isinstance(block, ToolUseBlock):
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name,
                                           "arguments": json.dumps(block.input, ensure_ascii=False)}})
                marker = block.cache_control or marker
        flush(self.role, calls)
        return out


class Tool(_MessagesBody):
    """A client tool. A server tool (a `type` such as web_search_20250305, code_execution_..., bash_...) is
    refused: tokenomy runs no tools itself, and silently dropping one would change what the model can do."""

    type: str | None = None
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tool(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(f"server tool {data.get('type')!r} (named {data.get('name')!r}) is not supported: "
                             "tokenomy serves client tools only (a name and an input_schema)")
        return data

    @field_validator("input_schema")
    @classmethod
    def _object(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError("input_schema must be a JSON Schema of type 'object'")
        return v

    def internal(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description:
            fn["description"] = self.description
        return _marked({"type": "function", "function": fn}, self.cache_control)


class ToolChoice(_MessagesBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("a tool_choice of type 'tool' needs the tool's name")
        return self

    def internal(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Metadata(_MessagesBody):
    user_id: str | None = None


class OutputConfig(_MessagesBody):
    """`format` (a JSON schema for the answer) is decoded under the grammar; `effort` is ignored."""

    format: dict[str, Any] | None = None

    @field_validator("format")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and (v.get("type") != "json_schema" or not isinstance(v.get("schema"), dict)):
            raise ValueError("format must be {\"type\": \"json_schema\", \"schema\": {...}}")
        return v


class CountTokensRequest(_MessagesBody):
    """What `/v1/messages/count_tokens` takes: the prompt of a Messages request, without its sampling."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Annotated[list[TextBlock], BeforeValidator(_text_blocks)] = Field(default_factory=list)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None      # a breakpoint on the last message (Anthropic: the last block)

    @model_validator(mode="after")
    def _checks(self) -> CountTokensRequest:
        if self.messages[-1].role == "assistant":
            raise ValueError("the last message is the assistant's (a prefill), which the models tokenomy serves "
                             "cannot continue: end with a user message")
        used: set[str] = set()          # the tool_use ids of the turns so far: a result answers one of them
        for i, m in enumerate(self.messages):
            for j, block in enumerate(m.content):
                parts = block.content if isinstance(block, ToolResultBlock) else [block]
                media = next((p for p in parts if isinstance(p, MediaBlock)), None)
                if media is not None:
                    raise ValueError(f"messages.{i}.content.{j}: {media.type} blocks are not supported: the model "
                                     f"'{self.model}' reads text only")
                if isinstance(block, ToolUseBlock):
                    used.add(block.id)
                elif isinstance(block, ToolResultBlock) and block.tool_use_id not in used:
                    raise ValueError(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                                     f"blocks: {block.tool_use_id}. Each `tool_result` block must have a "
                                     "corresponding `tool_use` block in an earlier assistant message.")
        if self.tool_choice is not None and self.tool_choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f"tool_choice of type '{self.tool_choice.type}' needs tools")
        if self.tool_choice is not None and self.tool_choice.type == "tool" and self.tools and \
                self.tool_choice.name not in {t.name for t in self.tools}:
            raise ValueError(f"tool_choice names the tool '{self.tool_choice.name}', which is not in tools")
        return self

    def internal_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system:
            marker = next((b.cache_control for b in reversed(self.system) if b.cache_control), None)
            out.append(_marked({"role": "system", "content": "\n\n".join(b.text for b in self.system)}, marker))
        for m in self.messages:
            out += m.internal()
        if self.cache_control and out and "cache_control" not in out[-1]:
            out[-1] = _marked(out[-1], self.cache_control)
        return out

    def gen_request(self, priority: str = "interactive") -> GenRequest:
        tools = [t.internal() for t in self.tools] if self.tools else None
        choice = self.tool_choice.internal() if self.tool_choice is not None and tools else None
        fmt = self.output_config.format if self.output_config is not None else None
        response_format = None if fmt is None else {
            "type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}
        return GenRequest(model=self.model, kind="chat", api="messages", messages=self.internal_messages(),
                          params=self.sampling(), tools=tools, tool_choice=choice, response_format=response_format,
                          priority=priority)

    def sampling(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use:
            d["parallel_tool_calls"] = False
        return d


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s for s in v):
            raise ValueError("stop sequences must not be empty")
        return v

    def gen_request(self, priority: str = "interactive") -> GenRequest:
        gen = super().gen_request(priority)
        gen.user = self.metadata.user_id if self.metadata is not None else None
        return gen

    def sampling(self) -> dict[str, Any]:
        d = super().sampling()
        d["max_tokens"] = self.max_tokens
        for key, value in (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k),
                           ("stop", self.stop_sequences or None)):
            if value is not None:
                d[key] = value
        return d


def _marked(item: dict[str, Any], cache_control: dict[str, Any] | None) -> dict[str, Any]:
    """`item` with tokenomy's prompt-cache marker: a breakpoint at its end (the brief's convention, kept for
    upstreams that cache by breakpoints; the embedded engine caches every prefix and ignores it)."""
    return {**item, "cache_control": cache_control} if cache_control else item


def body_error(errors: list[Any]) -> APIError:
    """The 400 for a body that does not validate (pydantic's `errors()`), as Anthropic words it:
    "<path>: <message>", the path without the names of union members ("messages.0.content.0.input")."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(400, "The request body must be a JSON object.", code="invalid_body")
    # a discriminated union names the member after the list index: messages.0.content.0.tool_use.input
    path = ".".join(x for i, x in enumerate(loc) if not (x in _BLOCK_TYPES and i and loc[i - 1].isdigit()))
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return APIError(400, f"{path}: {msg}" if path else msg, param=path or None, code="invalid_value")


_BLOCK_TYPES = {"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"}

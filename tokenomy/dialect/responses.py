"""OpenAI's Responses API request (`POST /v1/responses`) and its one mapping to the internal GenRequest.

The body is checked as strictly as chat completions' (schemas.py): unknown fields are ignored, known ones are
type-checked. Its `input` items, tools and formats then become an OpenAI-chat-shaped GenRequest(kind="chat",
api="responses"); what cannot be served is a 400 naming the item or the field (docs/api.md, "OpenAI Responses").

Tools, by type:
- `function`: honoured (a grammar makes the call, as for chat tools).
- `custom`: honoured, its input free text or constrained by its Lark or regex grammar (responses_custom.py).
- ignored, not shown to the model: `web_search` (and its preview and dated names), which Codex sends by default
  and without which the model answers from what it knows, as it may under tool_choice auto; and the tools a
  client runs itself whose call items the served model cannot write: `local_shell`, `shell`, `apply_patch`,
  `namespace`, `tool_search`.
- refused (400): hosted tools the caller would rely on and tokenomy cannot run (`file_search`,
  `code_interpreter`, `image_generation`, `mcp`, the computer-use tools) and any type it does not know.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenomy.context.compaction import SUMMARY_HEADER
from tokenomy.dialect.responses_custom import chat_custom_tool, custom_call, tool_name
from tokenomy.errors import APIError
from tokenomy.generation import MAX_MESSAGES, MAX_OUTPUT_TOKENS, GenRequest

IGNORED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "local_shell", "shell", "apply_patch", "namespace", "tool_search"})
REFUSED_TOOLS = frozenset({
    "file_search", "code_interpreter", "image_generation", "mcp", "computer", "computer_use",
    "computer_use_preview"})
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
ROLES = ("user", "system", "developer", "assistant")
MAX_METADATA = 16


class _ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def _bad(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


class ResponsesRequest(_ResponsesBody):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None
    background: bool | None = None
    prompt_cache_key: str | None = None       # no cache to key here: used as the session for replica affinity
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # echoed, otherwise ignored (docs/api.md): top_logprobs, safety_identifier, prompt_cache_retention,
    # text.verbosity; accepted and ignored: reasoning, include, client_metadata, service_tier, truncation,
    # max_tool_calls, stream_options
    top_logprobs: int | None = Field(None, ge=0, le=20)
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    conversation: str | dict[str, Any] | None = None   # a conversation's id (or {"id"}): api/conversations.py
    prompt: Any = None                        # refused: stored prompt templates are not served

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_MESSAGES:
            raise ValueError(f"input has {len(v)} items; a request may have at most {MAX_MESSAGES}")
        return v

    @field_validator("background")
    @classmethod
    def _background(cls, v: bool | None) -> bool | None:
        if v:
            raise ValueError("background responses are not supported; send the request without background")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} metadata pairs are allowed")
        for k, value in v.items():
            if len(k) > 64 or len(value) > 512:
                raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("auto", "none", "required"):
            raise ValueError("tool_choice must be auto, none, required or an object")
        return v

    # ---- the mapping -------------------------------------------------------------------------------------
    def gen_request(self, history: list[dict[str, Any]] | None = None) -> GenRequest:
        """The internal request: `instructions` as the system message, then `history` (the stored conversation of
        `previous_response_id`, so the prompt's prefix renders as the last turn's did), then this input. APIError
        400 for what cannot be served."""
        if self.conversation is not None and self.previous_response_id is not None:
            raise _bad("conversation and previous_response_id cannot both be given; continue either a conversation "
                       "or a response", "conversation", "mutually_exclusive")
        if self.prompt is not None:
            raise _bad("prompt templates are not supported; send the text as instructions and input", "prompt",
                       "unsupported_parameter")
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += list(history or []) + self.input_messages()
        if not any(m["role"] != "system" for m in messages):
            raise _bad("input must hold at least one message or item", "input")
        _check_outputs_answer_calls(messages)
        tools = self.chat_tools()
        params: dict[str, Any] = {k: v for k, v in (("max_tokens", self.max_output_tokens),
                                                     ("temperature", self.temperature), ("top_p", self.top_p),
                                                     ("presence_penalty", self.presence_penalty),
                                                     ("frequency_penalty", self.frequency_penalty))
                                  if v is not None}
        if self.parallel_tool_calls is not None:
            params["parallel_tool_calls"] = self.parallel_tool_calls
        tools, choice = self.chat_tool_choice(tools)
        return GenRequest(model=self.model, kind="chat", api="responses", messages=messages, params=params,
                          tools=tools, tool_choice=choice, response_format=self.response_format(),
                          user=self.user or self.prompt_cache_key)

    def input_messages(self) -> list[dict[str, Any]]:
        """This request's input as internal chat messages (reasoning items dropped; consecutive function calls
        joined into one assistant message, as chat clients send parallel calls)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            kind = item.get("type", "message" if "role" in item else None)
            if kind == "message":
                out.append(_message(item, where))
            elif kind in ("function_call", "custom_tool_call"):
                call = {"id": _string(item, "call_id", where), "type": "function",
                        "function": {"name": _string(item, "name", where),
                                     "arguments": _string(item, "arguments", where, empty=True)}
                        } if kind == "function_call" else custom_call(item, where)
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                            "content": _output(item.get("output"), where)})
            elif kind == "compaction":      # POST /v1/responses/compact's summary (dialect/responses_compact.py)
                out.append({"role": "system",
                            "content": f"{SUMMARY_HEADER} {_string(item, 'encrypted_content', where)}"})
            elif kind == "reasoning":
                continue                    # a model's own reasoning: nothing the served model can read
            elif kind is None:
                raise _bad(f"{where} needs a type (message, function_call, function_call_output, custom_tool_call, "
                           "custom_tool_call_output) or a role", where)
            else:
                raise _bad(f"{where} is of type {kind!r}, which is not supported; input items may be message, "
                           "function_call, function_call_output, custom_tool_call, custom_tool_call_output, "
                           "compaction or reasoning", f"{where}.type")
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The function tools in chat's shape; ignored types dropped, refused ones a 400 naming them."""
        if not self.tools:
            return None
        out = []
        for i, tool in enumerate(self.tools):
            kind = tool.get("type")
            where = f"tools[{i}]"
            if kind == "function":
                fn = {"name": _string(tool, "name", where)}
                if tool.get("description") is not None:
                    fn["description"] = tool["description"]
                fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
                if tool.get("strict") is not None:
                    fn["strict"] = tool["strict"]
                out.append({"type": "function", "function": fn})
            elif kind == "custom":
                out.append(chat_custom_tool(tool, where))
            elif kind in IGNORED_TOOLS:
                continue
            elif kind in REFUSED_TOOLS:
                raise _bad(f"{where}: tools of type {kind!r} are not supported (tokenomy cannot run OpenAI's hosted "
                           "tools); use function or custom tools", f"{where}.type", "unsupported_tool")
            else:
                raise _bad(f"{where}: unknown tool type {kind!r}; use function or custom tools", f"{where}.type",
                           "unsupported_tool")
        return out or None

    def chat_tool_choice(self, tools: list[dict[str, Any]] | None
                         ) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any] | None]:
        """(tools, tool_choice) in chat's shape; `allowed_tools` narrows the tools."""
        choice = self.tool_choice
        if choice is None or isinstance(choice, str):
            if choice == "required" and not tools:
                raise _bad("tool_choice 'required' needs at least one function tool", "tool_choice")
            return tools, choice if tools else None
        kind = choice.get("type")
        if kind == "function":
            name = choice.get("name")
            if not isinstance(name, str) or not any(t.get("function", {}).get("name") == name for t in tools or []):
                raise _bad(f"tool_choice names function {name!r}, which is not among the function tools",
                           "tool_choice")
            return tools, {"type": "function", "function": {"name": name}}
        if kind == "custom":
            name = choice.get("name")
            if not isinstance(name, str) or not any(t.get("custom", {}).get("name") == name for t in tools or []):
                raise _bad(f"tool_choice names custom tool {name!r}, which is not among the custom tools",
                           "tool_choice")
            return tools, {"type": "custom", "custom": {"name": name}}
        if kind == "allowed_tools":
            mode = choice.get("mode", "auto")
            listed = choice.get("tools")
            if mode not in ("auto", "required") or not isinstance(listed, list):
                raise _bad("tool_choice allowed_tools needs mode auto or required and a tools list", "tool_choice")
            names = {t.get("name") for t in listed if isinstance(t, dict) and t.get("type") in ("function", "custom")}
            kept = [t for t in tools or [] if tool_name(t) in names]
            if not kept and mode == "required":
                raise _bad("tool_choice allowed_tools lists no function tool of the request", "tool_choice")
            return kept or None, mode if kept else None
        raise _bad(f"tool_choice of type {kind!r} is not supported; use auto, none, required, a function or a "
                   "custom tool",
                   "tool_choice")

    def response_format(self) -> dict[str, Any] | None:
        """text.format as chat's response_format (json_schema goes through the grammar engine)."""
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "json_object"}
        if kind == "json_schema":
            if not isinstance(fmt.get("schema"), dict):
                raise _bad("text.format json_schema needs a schema object", "text.format.schema")
            spec = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
            for k in ("strict", "description"):
                if fmt.get(k) is not None:
                    spec[k] = fmt[k]
            return {"type": "json_schema", "json_schema": spec}
        raise _bad(f"text.format type {kind!r} is not supported; use text, json_object or json_schema",
                   "text.format.type")

    def wants_store(self, can_store: bool) -> bool:
        """Whether the answer is stored: `store`, default true as OpenAI's, but never without a store (no ledger)."""
        return can_store and self.store is not False


def assistant_message(text: str, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An answer as the internal assistant message the next turn's conversation carries."""
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        m["tool_calls"] = [{"id": c["id"], "type": "custom", "custom": dict(c["custom"])} if c.get("type") == "custom"
                           else {"id": c["id"], "type": "function",
                                 "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                           for c in tool_calls]
    return m


def input_items(body: ResponsesRequest, new_id: Any) -> list[dict[str, Any]]:
    """The request's input as Responses items with ids (what GET /v1/responses/{id}/input_items lists);
    `new_id(prefix)` makes an id for an item the client sent without one."""
    raw = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) \
        else body.input
    return items_with_ids(raw, new_id)


def items_with_ids(raw: list[dict[str, Any]], new_id: Any) -> list[dict[str, Any]]:
    """Input items as they are listed: a type on each, a message's string content as a text part, an id on
    each (`new_id(prefix)` for one sent without); reasoning items left out."""
    out = []
    for item in raw:
        kind = item.get("type", "message")
        if kind == "reasoning":
            continue
        d = dict(item, type=kind)
        if kind == "message":
            content = d.get("content")
            part = "output_text" if d.get("role") == "assistant" else "input_text"
            if isinstance(content, str):
                d["content"] = [{"type": part, "text": content}]
            d.setdefault("status", "completed")
        prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
                  "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_"}.get(kind, "item_")
        d.setdefault("id", new_id(prefix))
        out.append(d)
    return out


def _string(item: dict[str, Any], key: str, where: str, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not value and not empty):
        raise _bad(f"{where}.{key} must be a{'' if empty else ' non-empty'} string", f"{where}.{key}")
    return value


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
    return {"role": "system" if role == "developer" else role,
            "content": _content(item.get("content"), f"{where}.content")}


def _content(content: Any, where: str) -> str:
    """A message's text (`where` names the field): a string, or text parts joined; a media part is a 400 naming
    it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}[{j}]"
        if kind in MEDIA_PARTS:
            raise _bad(f"{at} is an {kind} part: the model reads text only, send input_text parts",
                       f"{at}.type", "unsupported_content")
        if kind not in TEXT_PARTS:
            raise _bad(f"{at} has type {kind!r}; content parts may be input_text or output_text", f"{at}.type")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise _bad(f"{at}.text must be a string", f"{at}.text")
        texts.append(text)
    return "".join(texts)


def _check_outputs_answer_calls(messages: list[dict[str, Any]]) -> None:
    """A tool output must answer a call made before it (in the history or this input): OpenAI's 400 otherwise."""
    called: set[str] = set()
    for m in messages:
        called.update(c.get("id") for c in m.get("tool_calls") or [])
        if m["role"] == "tool" and m.get("tool_call_id") not in called:
            raise _bad(f"No tool call found for function call output with call_id {m.get('tool_call_id')}.", "input")


def _output(output: Any, where: str) -> str:
    """A function_call_output's output: a string, or text parts; anything else JSON-encoded as the tool's text."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content(output, f"{where}.output")
    if output is None:
        raise _bad(f"{where}.output is required", f"{where}.output")
    return json.dumps(output, ensure_ascii=False)

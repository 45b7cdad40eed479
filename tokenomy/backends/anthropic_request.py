"""The internal request (OpenAI chat shape) as an Anthropic Messages request body, prompt-cache breakpoints placed.

    system and developer messages -> `system` text blocks, in order (wherever they stood)
    user / assistant messages     -> messages of text blocks; an assistant's tool_calls -> tool_use blocks, their
                                     JSON `arguments` parsed into `input`
    tool messages                 -> tool_result blocks in a user message (consecutive turns of one role merge,
                                     so the results of parallel calls share one message, as Messages requires)
    tools                         -> {name, description, input_schema}
    tool_choice                   -> auto | required: any | none | {function}: {type: tool}
    response_format               -> a tool the model must call, JSON_TOOL, whose input is the answer
                                     (see `Asked.json_tool`); offered beside the client's tools when it has some
    max_tokens                    -> max_tokens, the model's default when absent (Messages requires one)
    temperature / top_p / top_k   -> the same (temperature capped at 1, the Messages maximum), only with
                                     `sampling`: Claude models after Opus 4.6 refuse them, and the anthropic SDK
                                     no longer sends them
    stop                          -> stop_sequences, except whitespace-only ones, which Messages refuses: the
                                     backend cuts the answer at those itself (`Asked.local_stops`)
    user                          -> metadata.user_id
    a completion's prompt         -> one user message
Sampling keys Messages has no counterpart of (seed, penalties, logit_bias, min_p, logprobs ...) are not sent.

Prompt caching: a message, system message or tool that carries tokenomy's marker `cache_control` gets it on its
last block (`keep`). `auto` also marks, within Messages' 4 breakpoints, the end of the tools and system prompt and
the end of the conversation before its newest user turn: what the previous request of the same conversation sent,
plus the answer it got, so each turn reads the last one's prefix and writes only its own. `off` sends none.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenomy.backends.base import InvalidRequest
from tokenomy.generation import GenRequest

JSON_TOOL = "json_answer"
MAX_BREAKPOINTS = 4            # Messages refuses a request with more cache_control blocks
EPHEMERAL = {"type": "ephemeral"}
_ID = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass
class Asked:
    """A Messages body and how to read its answer back."""

    body: dict[str, Any]
    json_tool: str | None = None     # the tool whose input is the answer text (response_format), or None
    wrapped: bool = False            # its schema is not an object: the input is {"answer": <the answer>}
    local_stops: list[str] = field(default_factory=list)   # stop strings the backend matches (whitespace only)


def messages_request(req: GenRequest, model: str, max_tokens: int, cache_control: str = "keep",
                     sampling: bool = False) -> Asked:
    """The Messages body for `req`; InvalidRequest for what Messages cannot express."""
    if req.kind == "chat":
        system, messages = _conversation(req.messages or [])
    else:
        system, messages = [], [{"role": "user", "content": _text_blocks(req.prompt or "")}]
    if not messages:
        raise InvalidRequest("a Messages upstream needs at least one user or assistant message, not only system "
                             "messages", param="messages")
    p = req.params
    body: dict[str, Any] = {"model": model, "max_tokens": p.get("max_tokens") or max_tokens,
                            "messages": messages, "stream": True}
    if system:
        body["system"] = system
    if sampling and p.get("temperature") is not None:
        body["temperature"] = min(float(p["temperature"]), 1.0)
    if sampling and p.get("top_p") is not None:
        body["top_p"] = p["top_p"]
    if sampling and p.get("top_k"):             # 0: off, as vLLM reads it
        body["top_k"] = p["top_k"]
    stops = [p["stop"]] if isinstance(p.get("stop"), str) else list(p.get("stop") or [])
    if any(s.strip() for s in stops):
        body["stop_sequences"] = [s for s in stops if s.strip()]
    if req.user:
        body["metadata"] = {"user_id": req.user}
    asked = Asked(body, local_stops=[s for s in stops if s and not s.strip()])
    _tools_and_choice(req, asked)
    if cache_control == "off":
        _strip_marks(body)
    elif cache_control == "auto":
        _place_marks(body)
    return asked


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content (a string, or OpenAI text parts) as text blocks; empty text makes none."""
    if isinstance(content, list):
        text = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    else:
        text = content if isinstance(content, str) else ""
    return [{"type": "text", "text": text}] if text else []


def _tool_id(call_id: Any) -> str:
    """A tool call's id as Messages allows ids (letters, digits, _ and -); results name it the same way."""
    return _ID.sub("_", str(call_id or "call"))


def _tool_use(call: dict[str, Any], where: str) -> dict[str, Any]:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise InvalidRequest(f"{where}: tool call arguments are not JSON, which a Messages upstream needs: "
                             f"{str(raw)[:80]!r}", param=where) from None
    if not isinstance(args, dict):
        raise InvalidRequest(f"{where}: tool call arguments must be a JSON object for a Messages upstream",
                             param=where)
    return {"type": "tool_use", "id": _tool_id(call.get("id")), "name": fn.get("name") or "", "input": args}


def _conversation(msgs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages) of an OpenAI-shaped conversation."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role in ("system", "developer", "user"):
            blocks = _text_blocks(m.get("content"))
        elif role == "assistant":
            blocks = _text_blocks(m.get("content"))
            blocks += [_tool_use(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.get("tool_calls") or [])]
        elif role == "tool":
            content = m.get("content")
            blocks = [{"type": "tool_result", "tool_use_id": _tool_id(m.get("tool_call_id")),
                       "content": _text_blocks(content) if isinstance(content, list) else str(content or "")}]
            role = "user"
        else:
            raise InvalidRequest(f"messages[{i}].role {role!r} cannot be sent to a Messages upstream",
                                 param=f"messages[{i}].role")
        if not blocks:
            continue
        if m.get("cache_control"):
            blocks[-1] = {**blocks[-1], "cache_control": m["cache_control"]}
        if role in ("system", "developer"):
            system += blocks
        elif out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def _tools_and_choice(req: GenRequest, asked: Asked) -> None:
    body = asked.body
    tools = []
    for i, t in enumerate(req.tools or []):
        fn = t.get("function") or {}
        if t.get("type", "function") != "function" or not fn.get("name"):
            raise InvalidRequest(f"tools[{i}]: only function tools with a name can be sent to a Messages upstream",
                                 param=f"tools[{i}]")
        tool: dict[str, Any] = {"name": fn["name"], "input_schema": {"type": "object", **(fn.get("parameters") or {})}}
        if fn.get("description"):
            tool["description"] = fn["description"]
        if t.get("cache_control"):
            tool["cache_control"] = t["cache_control"]
        tools.append(tool)
    choice = req.tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not name:
            raise InvalidRequest("tool_choice: a function choice needs function.name", param="tool_choice")
        body["tool_choice"] = {"type": "tool", "name": name}
    elif choice == "required":
        body["tool_choice"] = {"type": "any"}
    elif choice in ("auto", "none"):
        body["tool_choice"] = {"type": choice}
    elif choice is not None:
        raise InvalidRequest(f"tool_choice {choice!r} is not one of auto, none, required or a function",
                             param="tool_choice")
    schema = _answer_schema(req.response_format)
    if schema is not None and choice in (None, "auto", "none"):
        if any(t["name"] == JSON_TOOL for t in tools):
            raise InvalidRequest(f"a tool may not be named {JSON_TOOL!r} together with response_format on a "
                                 "Messages upstream (it asks for the JSON answer by that tool)", param="tools")
        asked.json_tool = JSON_TOOL
        asked.wrapped = schema.get("type") != "object"
        if asked.wrapped:
            schema = {"type": "object", "properties": {"answer": schema}, "required": ["answer"]}
        tools.append({"name": JSON_TOOL, "description": "Give your answer: its input is the whole answer.",
                      "input_schema": schema})
        # with the client's tools callable, the model calls one of them or answers; else it must answer
        callable_tools = choice != "none" and len(tools) > 1
        body["tool_choice"] = {"type": "any"} if callable_tools else {"type": "tool", "name": JSON_TOOL}
    if tools:
        body["tools"] = tools


def _answer_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON Schema the answer must meet, or None for a text answer."""
    kind = (response_format or {}).get("type")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        return dict(schema) if isinstance(schema, dict) else {"type": "object"}
    return None


def _marked(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every block (and tool) of the body that may carry cache_control, in the prompt's order."""
    return [*body.get("tools", []), *body.get("system", []),
            *(b for m in body["messages"] for b in m["content"])]


def _strip_marks(body: dict[str, Any]) -> None:
    for block in _marked(body):
        block.pop("cache_control", None)


def _place_marks(body: dict[str, Any]) -> None:
    """Mark the end of tools + system, then the conversation before its newest user turn, while under the limit."""
    used = sum("cache_control" in b for b in _marked(body))
    targets = []
    prefix = body.get("system") or body.get("tools")
    if prefix:
        targets.append(prefix[-1])
    messages = body["messages"]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=0)
    if last_user >= 1:
        targets.append(messages[last_user - 1]["content"][-1])
    for block in targets:
        if used >= MAX_BREAKPOINTS:
            return
        if "cache_control" not in block:
            block["cache_control"] = dict(EPHEMERAL)
            used += 1

"""Custom tools in the Responses API (`{"type": "custom", "name", "description", "format"}`): the tool, its
`tool_choice`, its `custom_tool_call` and `custom_tool_call_output` input items, mapped to the internal chat shape
(structured/custom_tools.py constrains and parses the call), and its `custom_tool_call` output item.

`format`: `{"type": "text"}` (the default) or `{"type": "grammar", "syntax": "lark" | "regex", "definition"}`;
the grammar constrains the call's input through llguidance, as a json_schema constrains an answer.
"""

from __future__ import annotations

from typing import Any

from tokenomy.errors import APIError

SYNTAXES = ("lark", "regex")


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def chat_custom_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses custom tool in chat's shape: {"type": "custom", "custom": {"name", "description", "format"}}
    with a grammar format as {"type": "grammar", "grammar": {"syntax", "definition"}}."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name must be a non-empty string", f"{where}.name")
    spec: dict[str, Any] = {"name": name}
    if tool.get("description") is not None:
        spec["description"] = tool["description"]
    fmt = tool.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        spec["format"] = {"type": "text"}
    elif isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax not in SYNTAXES:
            raise _bad(f"{where}.format.syntax must be lark or regex, not {syntax!r}", f"{where}.format.syntax")
        if not isinstance(definition, str) or not definition.strip():
            raise _bad(f"{where}.format.definition must be a non-empty string", f"{where}.format.definition")
        spec["format"] = {"type": "grammar", "grammar": {"syntax": syntax, "definition": definition}}
    else:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        raise _bad(f"{where}.format type {kind!r} is not supported; use text or grammar", f"{where}.format.type")
    return {"type": "custom", "custom": spec}


def tool_name(tool: dict[str, Any]) -> str | None:
    """A chat-shaped tool's name, function or custom."""
    return (tool.get("function") or tool.get("custom") or {}).get("name")


def custom_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `custom_tool_call` input item as a chat tool call."""
    for key in ("call_id", "name"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise _bad(f"{where}.{key} must be a non-empty string", f"{where}.{key}")
    if not isinstance(item.get("input"), str):
        raise _bad(f"{where}.input must be a string", f"{where}.input")
    return {"id": item["call_id"], "type": "custom", "custom": {"name": item["name"], "input": item["input"]}}


def custom_call_item(item_id: str, call: dict[str, Any]) -> dict[str, Any]:
    """The `custom_tool_call` output item of a chat-shaped custom call (OpenAI's item has no status)."""
    spec = call.get("custom") or {}
    return {"type": "custom_tool_call", "id": item_id, "call_id": call["id"], "name": spec.get("name", ""),
            "input": spec.get("input", "")}

"""The tool-call convention: ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``.

The grammar (schema.py) makes the model write calls this way, on one line and with ``name`` before
``arguments``; this module turns such text into OpenAI ``tool_calls``, whole (``parse_tool_calls``) or as
streaming deltas (``ToolCallStream``, the shape OpenAI streams: a first delta per call with ``id``, ``type`` and
``name`` and empty ``arguments``, then ``arguments`` fragments as they are generated).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
CUSTOM_OPEN = '<custom_tool_call name="'     # a custom tool's call (custom_tools.py)
CUSTOM_CLOSE = "</custom_tool_call>"

# A call object's opening up to where its arguments value begins (whitespace tolerated for upstream text).
_HEADER = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def new_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls`` from a model output in the ``<tool_call>[...]</tool_call>`` convention.

    Returns ``[{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments": <JSON string>}}]``,
    or ``[]`` when the text is not a call (an ``auto`` answer in free text). A call cut short (max_tokens) or
    malformed raises ValueError. ``arguments`` is the parsed object re-serialised compactly (a stream carries the
    model's own text instead, which may differ by a space after ``:`` or ``,``).
    """
    body = text.lstrip()
    if not body.startswith(TOOL_CALL_OPEN):
        return []
    body = body[len(TOOL_CALL_OPEN):]
    end = body.rfind(TOOL_CALL_CLOSE)
    if end < 0:
        raise ValueError("tool call is incomplete: no closing </tool_call>")
    try:
        items = json.loads(body[:end])
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call is not valid JSON: {e}") from e
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise ValueError("tool call must be a non-empty JSON array of {name, arguments}")
    calls = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            raise ValueError("each tool call needs a string 'name'")
        args = json.dumps(item.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
        calls.append({"id": new_call_id(), "type": "function",
                      "function": {"name": item["name"], "arguments": args}})
    return calls


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """System-prompt text describing the tools and the call conventions the grammar enforces: function tools'
    ``<tool_call>`` JSON, custom tools' ``<custom_tool_call name="...">`` free text."""
    functions = [t for t in tools if isinstance(t, dict) and t.get("type", "function") == "function"]
    customs = [t for t in tools if isinstance(t, dict) and t.get("type") == "custom"]
    parts = []
    if functions:
        specs = [{k: t["function"][k] for k in ("name", "description", "parameters") if k in t["function"]}
                 for t in functions if isinstance(t.get("function"), dict)]
        parts.append(
            "You can call these functions:\n" + "\n".join(json.dumps(s, ensure_ascii=False) for s in specs)
            + f"\nTo call functions, answer only with {TOOL_CALL_OPEN}[{{\"name\": <function name>, "
            f"\"arguments\": <arguments object>}}]{TOOL_CALL_CLOSE}.")
    if customs:
        parts.append(custom_prompt(customs))
    return "\n".join(parts) + " Otherwise answer normally."


def custom_prompt(tools: list[dict[str, Any]]) -> str:
    """System-prompt text describing the custom tools and how a call to one is written."""
    lines = []
    for tool in tools:
        spec = tool.get("custom") or {}
        fmt = spec.get("format") or {}
        grammar = fmt.get("grammar") or fmt
        shape = (f" Its input follows this {grammar.get('syntax')} grammar: {grammar.get('definition')}"
                 if fmt.get("type") == "grammar" else "")
        lines.append(f"- {spec.get('name')}: {spec.get('description') or ''}{shape}")
    return ("You can call these tools, whose input is free text:\n" + "\n".join(lines)
            + f'\nTo call one, answer only with {CUSTOM_OPEN}<tool name>"><input>{CUSTOM_CLOSE}.')


class ToolCallStream:
    """Incremental parser: model text pieces in, (content delta, OpenAI tool_call deltas) out.

    Text is held back only while it could still be the start of ``<tool_call>``; after that it is either plain
    content (passed through) or a call list, whose ``arguments`` are streamed as raw fragments. ``calls`` holds
    the finished calls (``arguments`` complete) in OpenAI shape.
    """

    def __init__(self) -> None:
        self.mode: str | None = None  # None (undecided) | "text" | "calls"
        self.calls: list[dict[str, Any]] = []
        self._pending = ""
        self._body = ""  # text after <tool_call>
        self._pos = 0  # next character of _body to scan
        self._state = "list"  # list (between calls) | header | args | done
        self._start = 0  # where the current call object or its arguments begin
        self._emitted = 0  # how much of the current arguments has been sent
        self._depth = 0
        self._in_str = self._esc = False

    @property
    def finished(self) -> bool:
        """The call list was closed (``]`` seen)."""
        return self._state == "done"

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self.mode == "text":
            return text, []
        if self.mode is None:
            self._pending += text
            head = self._pending.lstrip()
            if head.startswith(TOOL_CALL_OPEN):
                self.mode = "calls"
                text, self._pending = head[len(TOOL_CALL_OPEN):], ""
            elif TOOL_CALL_OPEN.startswith(head):
                return "", []
            else:
                self.mode = "text"
                out, self._pending = self._pending, ""
                return out, []
        self._body += text
        return "", self._scan()

    def close(self) -> tuple[str, list[dict[str, Any]]]:
        """End of output: flush text held back while undecided."""
        if self.mode is None:
            self.mode = "text"
            out, self._pending = self._pending, ""
            return out, []
        return "", []

    def _scan(self) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        body = self._body
        i = self._pos
        while i < len(body) and self._state != "done":
            ch = body[i]
            if self._state == "list":
                if ch == "{":
                    self._state, self._start = "header", i
                elif ch == "]":
                    self._state = "done"
                i += 1
            elif self._state == "header":
                m = _HEADER.match(body, self._start)
                if not m or m.end() == len(body):  # wait until the arguments value has begun
                    break
                call = {"id": new_call_id(), "type": "function",
                        "function": {"name": json.loads(f'"{m.group(1)}"'), "arguments": ""}}
                self.calls.append(call)
                deltas.append({"index": len(self.calls) - 1, **call, "function": dict(call["function"])})
                self._state, self._start, self._emitted = "args", m.end(), m.end()
                self._depth, self._in_str, self._esc = 0, False, False
                i = m.end()
            else:  # args: scan until the "}" that closes the call object
                if self._in_str:
                    if self._esc:
                        self._esc = False
                    elif ch == "\\":
                        self._esc = True
                    elif ch == '"':
                        self._in_str = False
                elif ch == '"':
                    self._in_str = True
                elif ch in "{[":
                    self._depth += 1
                elif ch in "}]":
                    if self._depth == 0:
                        self._emit(deltas, i)
                        self.calls[-1]["function"]["arguments"] = self.calls[-1]["function"]["arguments"].rstrip()
                        self._state = "list"
                    else:
                        self._depth -= 1
                i += 1
        self._pos = i
        if self._state == "args":
            self._emit(deltas, i)
        return deltas

    def _emit(self, deltas: list[dict[str, Any]], end: int) -> None:
        fragment = self._body[self._emitted:end]
        if fragment:
            self.calls[-1]["function"]["arguments"] += fragment
            deltas.append({"index": len(self.calls) - 1, "function": {"arguments": fragment}})
        self._emitted = end

"""Custom tools: free-form tool input, plain or constrained by a Lark or regex grammar (OpenAI's `custom` tools).

In the OpenAI chat shape the internal request carries, a custom tool is ``{"type": "custom", "custom": {"name",
"description", "format": {"type": "text"} | {"type": "grammar", "grammar": {"syntax": "lark" | "regex",
"definition"}}}}`` and its call is ``{"id", "type": "custom", "custom": {"name", "input"}}``. The model writes a
call as

    <custom_tool_call name="NAME">INPUT</custom_tool_call>

where INPUT is any text without the closing tag (`text`), a match of the regex (`regex`), or a sentence of the
Lark grammar (`lark`, compiled by llguidance as a grammar of its own, referenced from the call rule). One custom
call per answer. schema.py puts these rules beside the function-call rules; ``CallStream`` parses the text back
into call deltas, custom or function.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenomy.structured.tools import CUSTOM_CLOSE, CUSTOM_OPEN, TOOL_CALL_OPEN, ToolCallStream, new_call_id

SYNTAXES = ("lark", "regex")
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_CLOSE_RE = re.escape(CUSTOM_CLOSE).replace("/", "\\/")     # inside a Lark /.../ literal
_OPENED = re.compile(r'<custom_tool_call name="([a-zA-Z0-9_-]{1,64})">')


def custom_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """{name: format} of the custom tools among chat-shaped `tools` (format: {"type": "text"} or {"type":
    "grammar", "syntax", "definition"}); ValueError naming the tool for a malformed one (schema.py makes it a
    SchemaError on `tools`)."""
    found: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict) or tool.get("type") != "custom":
            continue
        spec = tool.get("custom")
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"tools[{i}].custom.name must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if name in found:
            raise ValueError(f"tools[{i}]: duplicate tool name {name!r}")
        assert isinstance(spec, dict)
        found[name] = _format(spec.get("format"), f"tools[{i}].custom.format")
    return found


def _format(fmt: Any, where: str) -> dict[str, Any]:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return {"type": "text"}
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        raise ValueError(f"{where}.type must be text or grammar")
    grammar = fmt.get("grammar") if isinstance(fmt.get("grammar"), dict) else fmt
    syntax, definition = grammar.get("syntax"), grammar.get("definition")
    if syntax not in SYNTAXES:
        raise ValueError(f"{where}: grammar syntax must be lark or regex, not {syntax!r}")
    if not isinstance(definition, str) or not definition.strip():
        raise ValueError(f"{where}: the grammar needs a non-empty definition")
    return {"type": "grammar", "syntax": syntax, "definition": definition}


def custom_rules(customs: dict[str, dict[str, Any]]) -> tuple[list[str], list[str], dict[str, str]]:
    """(start alternatives, Lark rules, {grammar name: Lark text}) for calls to `customs`: one rule per tool,
    and for a Lark-syntax tool a grammar of its own that its rule references as ``@name``."""
    alternatives, rules, grammars = [], [], {}
    for i, (name, fmt) in enumerate(customs.items()):
        rule, opening = f"custom_call_{i}", json.dumps(f'{CUSTOM_OPEN}{name}">')
        if fmt["type"] == "text":       # any text up to the first closing tag, the tag included: one lexeme
            rules.append(f"{rule}: {opening} CUSTOM_TEXT_{i}")
            rules.append(f"CUSTOM_TEXT_{i}: (/(?s:.*)/ & ~/(?s:.*){_CLOSE_RE}(?s:.*)/) {json.dumps(CUSTOM_CLOSE)}")
        elif fmt["syntax"] == "regex":
            rules.append(f"{rule}: {opening} CUSTOM_INPUT_{i} {json.dumps(CUSTOM_CLOSE)}")
            rules.append(f"CUSTOM_INPUT_{i}: /{_slashes(fmt['definition'])}/")
        else:
            grammars[f"custom_input_{i}"] = fmt["definition"]
            rules.append(f"{rule}: {opening} @custom_input_{i} {json.dumps(CUSTOM_CLOSE)}")
        alternatives.append(rule)
    return alternatives, rules, grammars


def with_grammars(top: str, grammars: dict[str, str]) -> str:
    """A grammar (Lark text, or llguidance's top-level JSON) with the named Lark grammars its rules reference
    added, as llguidance's top-level JSON."""
    if not grammars:
        return top
    doc = json.loads(top) if top.lstrip().startswith("{") else {"grammars": [{"lark_grammar": top}]}
    doc["grammars"] += [{"name": name, "lark_grammar": text} for name, text in grammars.items()]
    return json.dumps(doc)


def _slashes(regex: str) -> str:
    """A regex as the body of a Lark /.../ literal: each unescaped slash escaped."""
    return re.sub(r"(?<!\\)((?:\\\\)*)/", r"\1\\/", regex)


class CallStream:
    """The answer's text in, (content delta, tool-call deltas) out, for an answer that may call function tools
    (``<tool_call>``, parsed by ToolCallStream) or custom ones. A custom call's deltas: first ``{"index", "id",
    "type": "custom", "custom": {"name", "input": ""}}``, then ``{"index", "custom": {"input": fragment}}``; text
    that may be the start of the closing tag is held back until it is known not to be. ``calls``: the calls so
    far in OpenAI's shape."""

    def __init__(self) -> None:
        self.functions = ToolCallStream()
        self.mode: str | None = None     # None (undecided) | "text" | "functions" | "custom"
        self.custom: dict[str, Any] | None = None
        self._pending = ""
        self._done = False

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [self.custom] if self.custom is not None else self.functions.calls

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self.mode in ("text", "functions"):
            return self.functions.feed(text)
        self._pending += text
        if self.mode is None:
            head = self._pending.lstrip()
            m = _OPENED.match(head)
            if head.startswith(TOOL_CALL_OPEN):
                self.mode, pending, self._pending = "functions", self._pending, ""
                return self.functions.feed(pending)
            if m is not None:
                self.mode, self._pending = "custom", head[m.end():]
                self.custom = {"id": new_call_id(), "type": "custom",
                               "custom": {"name": m.group(1), "input": ""}}
                first = {"index": 0, **self.custom, "custom": dict(self.custom["custom"])}
                return "", [first, *self._input()]
            naming = head.startswith(CUSTOM_OPEN) and '">' not in head and len(head) <= len(CUSTOM_OPEN) + 66
            if TOOL_CALL_OPEN.startswith(head) or CUSTOM_OPEN.startswith(head) or naming:
                return "", []           # may still open a call
            self.mode, pending, self._pending = "text", self._pending, ""
            return self.functions.feed(pending)
        return "", self._input()

    def close(self) -> tuple[str, list[dict[str, Any]]]:
        """End of output: flush what was held back."""
        if self.mode in ("text", "functions"):
            return self.functions.close()
        if self.mode == "custom":
            return "", self._input(final=True)
        self.mode, pending, self._pending = "text", self._pending, ""
        text, _ = self.functions.feed(pending)
        rest, _ = self.functions.close()
        return text + rest, []

    def _input(self, final: bool = False) -> list[dict[str, Any]]:
        """Deltas of the custom call's input written so far, up to its closing tag."""
        if self._done or self.custom is None:
            return []
        text, end = self._pending, self._pending.find(CUSTOM_CLOSE)
        if end >= 0:
            fragment, self._done, self._pending = text[:end], True, ""
        else:
            keep = 0 if final else next((k for k in range(min(len(CUSTOM_CLOSE) - 1, len(text)), 0, -1)
                                         if CUSTOM_CLOSE.startswith(text[-k:])), 0)
            fragment, self._pending = text[:len(text) - keep], text[len(text) - keep:]
        if not fragment:
            return []
        self.custom["custom"]["input"] += fragment
        return [{"index": 0, "custom": {"input": fragment}}]

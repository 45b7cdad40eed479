"""OpenAI request fields -> one grammar for constrained decoding (tool-call text -> ``tool_calls``: tools.py).

Output conventions the grammar enforces:

- ``response_format: {type: json_schema}`` -> the answer is one JSON document valid under the schema, on one
  line (no whitespace outside strings except one space after ``,`` and ``:``);
  ``{type: json_object}`` -> any JSON object.
- tools -> a call is ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``: one JSON array (several
  items only when parallel calls are allowed), each item's ``arguments`` valid under that function's
  ``parameters``. ``tool_choice``: ``required`` forces a call to any tool, a named function forces exactly one
  call to it, ``auto`` lets the model either call or answer (free text not starting with ``<tool_call>``, or the
  ``response_format`` answer when one is given), ``none`` ignores the tools.

``tools_prompt(tools)`` (tools.py) is the system-prompt text that tells the model this convention (SmolLM2's
chat template has no tool syntax of its own).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import llguidance
from cachetools import LRUCache, cached

from tokenomy.structured.custom_tools import CUSTOM_OPEN, custom_rules, custom_tools, with_grammars
from tokenomy.structured.normalize import normalize, rebase_refs
from tokenomy.structured.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_tool_calls, tools_prompt

__all__ = ["JSON_OPTIONS", "OutputFormat", "SchemaError", "json_schema_format", "output_format",
           "parse_tool_calls", "tools_prompt"]

# Fixed separators, no other whitespace: ", " between items and ": " after keys, the way SmolLM2 writes JSON.
# Deterministic separators let fast-forward write them (and, in closed objects, the next key) without a
# sampling step. Measured with SmolLM2 greedy on 6 extraction + 9 dev-schema prompts: forced-token share 0.23
# and 0.77 decode calls per token with ", "/": ", 0.19/0.81 with ","/":"; an optional space (", ?"/": ?")
# gave 0.12/0.88 on a similar 21-prompt set. Validity was the same within one answer.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

MEMO_ENTRIES = 256

# Close object schemas that list properties (additionalProperties: false where sound; see normalize.py).
CLOSE_OBJECTS = True

_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


class _Bounds(NamedTuple):
    """Default size bounds for free strings and unbounded arrays (a narrowing, see normalize.bound_sizes);
    None leaves that kind of value unbounded."""

    max_length: int | None
    max_items: int | None


class SchemaError(ValueError):
    """A request's schema or tools cannot be turned into a grammar; the API answers 400 with ``reason``.

    ``param`` names the offending request field (OpenAI error ``param``): response_format, tools, tool_choice.
    """

    def __init__(self, reason: str, param: str = "response_format") -> None:
        super().__init__(reason)
        self.reason = reason
        self.param = param


@dataclass(frozen=True)
class OutputFormat:
    """What a constrained answer must look like: the grammar to compile plus what is needed to check it.

    ``key`` is the SHA-256 of ``grammar`` (the compile-cache key). ``schema`` is the answer's JSON Schema when
    the answer is JSON, ``tools`` maps each callable function name to its parameters schema.
    """

    kind: str  # "json_schema" | "json_object" | "tools"
    grammar: str
    schema: dict[str, Any] | None = None
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    customs: dict[str, dict[str, Any]] = field(default_factory=dict)   # callable custom tools: name -> format
    may_answer: bool = True  # a non-call answer is allowed
    may_call: bool = False  # a tool call is allowed
    name: str | None = None  # response_format.json_schema.name
    strict: bool = False
    # Keywords taken out of the grammar because llguidance cannot enforce them (normalize.relax): the grammar
    # then admits answers the schema refuses, so every answer must be validated (pipeline/generate.py).
    relaxed: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        """The request field a compile error is reported against."""
        return "tools" if self.kind == "tools" else "response_format"

    @property
    def key(self) -> str:
        return hashlib.sha256(self.grammar.encode()).hexdigest()


def output_format(
    response_format: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: str | dict[str, Any] | None = None,
    parallel_tool_calls: bool = True,
    *,
    max_string_length: int | None = None,
    max_array_items: int | None = None,
) -> OutputFormat | None:
    """The grammar for a chat completion request's structured-output fields; None when output is free text.

    ``max_string_length`` / ``max_array_items``: default bounds for free strings and unbounded arrays (a
    narrowing, see normalize.bound_sizes; config ``structured:``); None leaves them unbounded.

    Raises SchemaError (with the offending ``param``) for malformed fields: an unknown response_format type, a
    schema that is not a JSON object, a tool without a valid name, tool_choice naming an unknown function...
    Results are memoised by the fields' content: rewriting a large schema (hundreds of ms for a 1 MB one) is
    paid once, like its compilation.
    """
    bounds = _Bounds(max_string_length, max_array_items)
    try:
        # Key order kept: property order in a schema is the order the model writes the properties in.
        # The module settings are part of the key, so changing them (benches, tests) never reuses a stale grammar.
        key = hashlib.sha256(json.dumps([response_format, tools, tool_choice, parallel_tool_calls, JSON_OPTIONS,
                                         CLOSE_OBJECTS, bounds]).encode()
                             ).hexdigest()
    except (TypeError, ValueError) as e:
        raise SchemaError(f"response_format and tools must be plain JSON: {e}") from None
    return _output_format(key, response_format, tools, tool_choice, parallel_tool_calls, bounds)


@cached(LRUCache(MEMO_ENTRIES), key=lambda key, *_: key, lock=threading.Lock())
def _output_format(key: str, response_format: Any, tools: Any, tool_choice: Any, parallel_tool_calls: bool,
                   bounds: _Bounds) -> OutputFormat | None:
    """The OutputFormat of the request's fields, memoised by `key` (their hash and the module's settings)."""
    # A private copy: the memoised format must not change if the caller later mutates its request.
    response_format, tools = copy.deepcopy(response_format), copy.deepcopy(tools)
    answer = _answer_schema(response_format)
    relaxed: set[str] = set()
    choice, functions = _tool_choice(tool_choice, tools)
    if choice == "none":
        if answer is None:
            return None
        kind, schema, name, strict = answer
        # The JSON form skips the Lark front end, which costs about 5 ms per compile.
        grammar = llguidance.LLMatcher.grammar_from_json_schema(_normalized(schema, bounds, relaxed),
                                                                overrides=JSON_OPTIONS)
        return OutputFormat(kind=kind, grammar=grammar, schema=schema, name=name, strict=strict,
                            relaxed=tuple(sorted(relaxed)))

    customs = _customs(tools)
    if choice in customs:
        callable_, customs = {}, {choice: customs[choice]}
    elif choice not in ("auto", "required"):
        callable_, customs = {choice: functions[choice]}, {}
    else:
        callable_ = functions
    alternatives, rules, grammars = custom_rules(customs)
    if callable_:
        calls = _calls_schema(callable_, bounds, relaxed,
                              single=not parallel_tool_calls or choice not in ("auto", "required"))
        alternatives.insert(0, "calls")
        rules += [f'calls: "{TOOL_CALL_OPEN}" call_list "{TOOL_CALL_CLOSE}"',
                  f"call_list: %json {_json_text(calls, bounds, relaxed)}"]
    call = " | ".join(alternatives)
    schema = name = None
    strict = False
    if choice != "auto":
        start = f"start: {call}"
    elif answer is None:
        # Free text that does not open a call: once "<tool_call>" is written, the call grammar takes over.
        start = f"start: TEXT | {call}"
        rules.append(f"TEXT: /(?s:.*)/ & ~/\\s*{re.escape(TOOL_CALL_OPEN)}(?s:.*)/"
                     + (f" & ~/\\s*{re.escape(CUSTOM_OPEN)}(?s:.*)/" if customs else ""))
    else:
        _, schema, name, strict = answer
        start = f"start: answer | {call}"
        rules.append(f"answer: %json {_json_text(schema, bounds, relaxed)}")
    return OutputFormat(kind="tools", grammar=with_grammars(_lark("\n".join([start, *rules])), grammars),
                        schema=schema, tools={n: f["parameters"] for n, f in callable_.items()}, customs=customs,
                        may_answer=choice == "auto", may_call=True, name=name, strict=strict,
                        relaxed=tuple(sorted(relaxed)))


def json_schema_format(schema: dict[str, Any], *, max_string_length: int | None = None,
                       max_array_items: int | None = None) -> OutputFormat:
    """The format for a bare JSON Schema (what ``response_format: json_schema`` carries); bounds as in
    ``output_format``."""
    fmt = output_format({"type": "json_schema", "json_schema": {"name": "schema", "schema": schema}},
                        max_string_length=max_string_length, max_array_items=max_array_items)
    assert fmt is not None
    return fmt


def _answer_schema(response_format: Any) -> tuple[str, dict[str, Any], str | None, bool] | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise SchemaError("response_format must be an object")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return "json_object", dict(_ANY_OBJECT), None, False
    if kind != "json_schema":
        raise SchemaError(f"response_format.type must be text, json_object or json_schema, not {kind!r}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise SchemaError("response_format.json_schema must be an object with name and schema")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not _FUNCTION_NAME.match(name)):
        raise SchemaError("response_format.json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$")
    schema = spec.get("schema")
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise SchemaError("response_format.json_schema.schema must be a JSON Schema object")
    return "json_schema", schema, name, bool(spec.get("strict", False))


def _tool_choice(tool_choice: Any, tools: Any) -> tuple[str, dict[str, dict[str, Any]]]:
    """(``none`` | ``auto`` | ``required`` | a function or custom tool's name, {name: {"parameters": schema}})."""
    functions = _functions(tools)
    customs = _customs(tools)
    if tool_choice is None:
        return ("auto" if functions or customs else "none"), functions
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise SchemaError(f"tool_choice must be none, auto, required or a function, not {tool_choice!r}",
                              "tool_choice")
        if tool_choice != "none" and not functions and not customs:
            raise SchemaError(f"tool_choice {tool_choice!r} needs a non-empty tools list", "tool_choice")
        return tool_choice, functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            raise SchemaError(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
        return name, functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "custom":
        name = (tool_choice.get("custom") or {}).get("name")
        if name not in customs:
            raise SchemaError(f"tool_choice names custom tool {name!r}, which is not in tools", "tool_choice")
        return name, functions
    raise SchemaError("tool_choice must be a string, {type: function, function: {name}} or {type: custom, "
                      "custom: {name}}", "tool_choice")


def _customs(tools: Any) -> dict[str, dict[str, Any]]:
    try:
        return custom_tools(tools)
    except ValueError as e:
        raise SchemaError(str(e), "tools") from None


def _functions(tools: Any) -> dict[str, dict[str, Any]]:
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise SchemaError("tools must be a list", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") == "custom":
            continue                    # custom_tools.py
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise SchemaError(f"tools[{i}] must be {{type: function, function: {{...}}}} or {{type: custom, "
                              "custom: {...}}", "tools")
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise SchemaError(f"tools[{i}].function.name must match ^[a-zA-Z0-9_-]{{1,64}}$", "tools")
        if name in functions:
            raise SchemaError(f"tools[{i}]: duplicate function name {name!r}", "tools")
        params = fn.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})
        if params is True:
            params = {}
        if not isinstance(params, dict):
            raise SchemaError(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        functions[name] = {"parameters": params}
    return functions


def _calls_schema(functions: dict[str, dict[str, Any]], bounds: _Bounds, relaxed: set[str],
                  single: bool) -> dict[str, Any]:
    """JSON Schema of the call list: an array of {name: const, arguments: parameters}, one branch per function."""
    branches = []
    for i, (name, fn) in enumerate(functions.items()):
        # a deep copy: rebasing must not touch the request's schema
        params = _normalized(fn["parameters"], bounds, relaxed)
        params.pop("$schema", None)
        params.pop("$id", None)
        rebase_refs(params, f"/items/anyOf/{i}/properties/arguments")
        branches.append({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
    if single:
        schema["maxItems"] = 1
    return schema


def _normalized(schema: dict[str, Any], bounds: _Bounds, relaxed: set[str]) -> dict[str, Any]:
    """The schema the grammar is built from; what had to be relaxed is added to ``relaxed``."""
    try:
        return normalize(schema, close=CLOSE_OBJECTS, max_length=bounds.max_length, max_items=bounds.max_items,
                         relaxed=relaxed)
    except RecursionError as e:  # deepcopy recurses; a pathologically deep schema lands here
        raise SchemaError("schema is nested too deeply") from e


def _json_text(schema: dict[str, Any], bounds: _Bounds, relaxed: set[str]) -> str:
    """A schema as inline ``%json`` text: normalised, with JSON_OPTIONS as its ``x-guidance``."""
    out = _normalized(schema, bounds, relaxed)
    out["x-guidance"] = JSON_OPTIONS
    return json.dumps(out, ensure_ascii=False)


def _lark(text: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(text)

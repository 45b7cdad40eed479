"""Custom tools' grammar (structured/custom_tools.py through schema.output_format): a call's input is free text,
a regex match or a Lark sentence, the call rules sit beside the function-call rules, and CallStream parses the
model's text back into custom or function call deltas."""

from __future__ import annotations

from typing import Any

import pytest

from tokenomy.structured import SchemaError, output_format
from tokenomy.structured.custom_tools import CallStream

DIGITS = {"type": "custom", "custom": {"name": "code", "description": "three digits",
                                       "format": {"type": "grammar", "grammar": {"syntax": "regex",
                                                                                 "definition": "[0-9]{3}"}}}}
NOTE = {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}
SUM = {"type": "custom", "custom": {"name": "sum", "format": {"type": "grammar", "grammar": {
    "syntax": "lark", "definition": 'start: expr\nexpr: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/'}}}}
SLASH = {"type": "custom", "custom": {"name": "path", "format": {"type": "grammar", "grammar": {
    "syntax": "regex", "definition": "/[a-z]+/[a-z]+"}}}}
FN = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


def call(name: str, text: str) -> str:
    return f'<custom_tool_call name="{name}">{text}</custom_tool_call>'


def accepts(compiler: Any, tokenizer: Any, fmt: Any, text: str) -> bool:
    m = compiler.compile(fmt).matcher()
    return bool(m.consume_tokens(tokenizer.tokenize_str(text))) and not m.is_error() and m.is_accepting()


def test_a_forced_regex_tool_takes_only_a_match(compiler, tokenizer):
    fmt = output_format(None, [DIGITS, NOTE, FN], {"type": "custom", "custom": {"name": "code"}})
    assert fmt is not None and fmt.customs == {"code": {"type": "grammar", "syntax": "regex",
                                                        "definition": "[0-9]{3}"}}
    assert not fmt.may_answer and fmt.tools == {}
    assert accepts(compiler, tokenizer, fmt, call("code", "123"))
    for bad in (call("code", "12"), call("code", "1234"), call("code", "12a"), call("note", "x"), "hello",
                '<tool_call>[{"name": "f", "arguments": {"a": 1}}]</tool_call>'):
        assert not accepts(compiler, tokenizer, fmt, bad), bad


def test_auto_allows_text_functions_and_each_custom_tool_in_its_grammar(compiler, tokenizer):
    fmt = output_format(None, [DIGITS, NOTE, SUM, SLASH, FN], "auto")
    assert fmt is not None and fmt.may_answer and set(fmt.customs) == {"code", "note", "sum", "path"}
    for good in ("Just text.", call("note", "any <b>text</b>, even </custom"), call("sum", "1+22"),
                 call("path", "/usr/bin"), '<tool_call>[{"name": "f", "arguments": {"a": 1}}]</tool_call>'):
        assert accepts(compiler, tokenizer, fmt, good), good
    for bad in (call("sum", "1+"), call("path", "usr"), call("nobody", "1"), call("note", "a") + "more"):
        assert not accepts(compiler, tokenizer, fmt, bad), bad


@pytest.mark.parametrize("tools, choice, says", [
    ([{"type": "custom", "custom": {"name": "has space"}}], "auto", "name"),
    ([{"type": "custom", "custom": {"name": "x", "format": {"type": "grammar", "grammar": {"syntax": "ebnf",
                                                                                           "definition": "a"}}}}],
     "auto", "lark or regex"),
    ([{"type": "custom", "custom": {"name": "x", "format": {"type": "grammar", "grammar": {"syntax": "regex"}}}}],
     "auto", "definition"),
    ([NOTE, NOTE], "auto", "duplicate"),
    ([NOTE], {"type": "custom", "custom": {"name": "other"}}, "custom tool 'other'"),
])
def test_malformed_custom_tools_are_schema_errors(tools, choice, says):
    with pytest.raises(SchemaError, match=says):
        output_format(None, tools, choice)


def test_a_bad_grammar_is_refused_at_compile(compiler):
    bad = {"type": "custom", "custom": {"name": "x", "format": {"type": "grammar", "grammar": {
        "syntax": "lark", "definition": "start: ("}}}}
    with pytest.raises(SchemaError):
        compiler.compile(output_format(None, [bad], "required"))


def test_the_call_stream_parses_a_custom_call_in_pieces():
    s = CallStream()
    pieces = ['<cust', 'om_tool_call name="no', 'te">hel', 'lo </cus', 'x </custom_tool', '_call>']
    out = [s.feed(p) for p in pieces] + [s.close()]
    assert all(text == "" for text, _ in out)
    deltas = [d for _, ds in out for d in ds]
    assert deltas[0]["type"] == "custom" and deltas[0]["custom"] == {"name": "note", "input": ""}
    assert "".join(d["custom"]["input"] for d in deltas[1:]) == "hello </cusx "
    assert s.calls == [{"id": deltas[0]["id"], "type": "custom", "custom": {"name": "note", "input": "hello </cusx "}}]


def test_the_call_stream_passes_text_and_function_calls_through():
    s = CallStream()
    assert s.feed("<cu") == ("", []) and s.feed("be") == ("<cube", []) and s.close() == ("", []) and s.calls == []
    s = CallStream()
    _, deltas = s.feed('<tool_call>[{"name": "f", "arguments": {"a": 1}}]</tool_call>')
    assert deltas[0]["function"]["name"] == "f" and s.calls[0]["function"]["arguments"] == '{"a": 1}'
    s = CallStream()
    assert s.feed("<custom_tool") == ("", []) and s.close() == ("<custom_tool", [])

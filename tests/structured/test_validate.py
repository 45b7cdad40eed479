import json

import pytest

from tokenomy.structured.schema import SchemaError, output_format, parse_tool_calls
from tokenomy.structured.validate import check_schema, validate, validate_output, validate_tool_calls

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                          "email": {"type": "string", "format": "email"}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}}}]


def test_valid_and_invalid_answers():
    assert validate('{"name":"Ada","age":36}', PERSON).ok
    r = validate('{"name":"Ada","age":-1,"extra":1}', PERSON)
    assert not r.ok and len(r.errors) == 2 and any("$.age" in e for e in r.errors)
    assert r.value == {"name": "Ada", "age": -1, "extra": 1}
    bad = validate('{"name":"Ada","age":3', PERSON)
    assert not bad.ok and bad.errors[0].startswith("not valid JSON")


def test_format_is_checked():
    assert not validate('{"name":"Ada","age":3,"email":"no-at-sign"}', PERSON).ok
    assert validate('{"name":"Ada","age":3,"email":"ada@example.org"}', PERSON).ok


def test_draft_follows_dollar_schema():
    # draft-4 exclusiveMaximum is a boolean; under 2020-12 that schema would be invalid.
    s = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "maximum": 5,
         "exclusiveMaximum": True}
    assert validate("4", s).ok and not validate("5", s).ok


def test_invalid_schema_is_the_requests_fault():
    with pytest.raises(SchemaError, match="invalid JSON Schema"):
        check_schema({"type": 5})
    with pytest.raises(SchemaError):
        validate("1", {"minimum": "zero"})


def test_tool_calls():
    calls = parse_tool_calls('<tool_call>[{"name":"add","arguments":{"x":1,"y":2}}]</tool_call>')
    tools = output_format(None, TOOLS, "required").tools
    assert validate_tool_calls(calls, tools).ok
    calls[0]["function"]["arguments"] = json.dumps({"x": 1})
    r = validate_tool_calls(calls, tools)
    assert not r.ok and r.errors[0].startswith("tool_calls[0].arguments")
    calls[0]["function"]["name"] = "sub"
    assert "unknown function" in validate_tool_calls(calls, tools).errors[0]


def test_validate_output_by_format():
    required = output_format(None, TOOLS, "required")
    assert not validate_output("I think it is 3.", required).ok
    assert validate_output('<tool_call>[{"name":"add","arguments":{"x":1,"y":2}}]</tool_call>', required).ok
    auto = output_format(None, TOOLS, "auto")
    assert validate_output("It is 3.", auto).ok
    assert not validate_output('<tool_call>[{"name":"add","arguments":{"x":1', auto).ok
    fmt = output_format({"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    assert validate_output('{"name":"Ada","age":36}', fmt).ok
    assert not validate_output("Ada, 36", fmt).ok

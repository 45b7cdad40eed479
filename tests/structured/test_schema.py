import json

import pytest

from tokenomy.structured.schema import SchemaError, output_format

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_free_text_requests_have_no_grammar():
    assert output_format() is None
    assert output_format({"type": "text"}) is None
    assert output_format(None, [WEATHER], "none") is None


def test_json_schema_and_json_object():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = output_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert fmt.kind == "json_schema" and fmt.schema == schema and fmt.strict and fmt.name == "x"
    assert not fmt.may_call and fmt.param == "response_format"
    obj = output_format({"type": "json_object"})
    assert obj.kind == "json_object" and obj.schema == {"type": "object"}
    assert fmt.key != obj.key and len(fmt.key) == 64


def test_same_request_same_key():
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert output_format(rf).key == output_format(json.loads(json.dumps(rf))).key


@pytest.mark.parametrize("rf, fragment", [
    ("json", "must be an object"),
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}, "schema must be"),
    ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name must match"),
])
def test_bad_response_format(rf, fragment):
    with pytest.raises(SchemaError) as e:
        output_format(rf)
    assert fragment in e.value.reason and e.value.param == "response_format"


@pytest.mark.parametrize("tools, choice, param, fragment", [
    ({"a": 1}, None, "tools", "must be a list"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "tools", "name must match"),
    ([WEATHER, WEATHER], None, "tools", "duplicate"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], None, "tools", "parameters"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "not in tools"),
    (None, "required", "tool_choice", "needs a non-empty tools"),
    ([WEATHER], "sometimes", "tool_choice", "must be none, auto"),
])
def test_bad_tools(tools, choice, param, fragment):
    with pytest.raises(SchemaError) as e:
        output_format(None, tools, choice)
    assert e.value.param == param and fragment in e.value.reason


def test_tool_formats():
    auto = output_format(None, [WEATHER, TIME])
    assert auto.kind == "tools" and auto.may_answer and auto.may_call and set(auto.tools) == {"get_weather",
                                                                                              "get_time"}
    req = output_format(None, [WEATHER, TIME], "required")
    assert not req.may_answer and req.param == "tools"
    named = output_format(None, [WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert set(named.tools) == {"get_time"} and not named.may_answer
    both = output_format({"type": "json_object"}, [WEATHER], "auto")
    assert both.schema == {"type": "object"} and both.may_answer
    assert len({auto.key, req.key, named.key, both.key}) == 4


def test_tool_parameters_with_refs_are_not_mutated():
    params = {"type": "object", "properties": {"p": {"$ref": "#/definitions/pt"}},
              "definitions": {"pt": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    fmt = output_format(None, [tool], "required")
    assert params["properties"]["p"]["$ref"] == "#/definitions/pt"
    assert "#/items/anyOf/0/properties/arguments/definitions/pt" in fmt.grammar


def test_formats_are_memoised_and_isolated_from_the_request():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "m", "schema": schema}}
    first = output_format(rf)
    assert output_format(rf) is first
    schema["properties"]["a"]["type"] = "string"  # the caller reuses and edits its dict
    assert first.schema["properties"]["a"]["type"] == "integer"
    assert output_format(rf).key != first.key
    reordered = {"type": "json_schema", "json_schema": {"name": "m", "schema": {
        "type": "object", "properties": {"b": {}, "a": {}}}}}
    ordered = {"type": "json_schema", "json_schema": {"name": "m", "schema": {
        "type": "object", "properties": {"a": {}, "b": {}}}}}
    assert output_format(reordered).key != output_format(ordered).key  # property order is the output order

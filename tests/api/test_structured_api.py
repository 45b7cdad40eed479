"""Structured output and tool calling through the official openai client on the embedded engine."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 10}},
                                       "required": ["tz"], "additionalProperties": False}}}


def test_json_schema_output_validates(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_mode(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a cat."}],
                                       max_tokens=48, temperature=0, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


def test_named_tool_call_non_stream_and_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
              max_tokens=40, temperature=0)
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_required_tool_choice_calls_some_tool(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What time is it in UTC?"}], tools=[WEATHER, TIME],
        tool_choice="required", max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name in ("get_weather", "get_time")


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "a": {"$ref": "#/definitions/missing"}}}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
    {"type": "xml"},
])
def test_bad_schemas_get_400_naming_the_reason(client, fmt):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       response_format=fmt)
    assert e.value.status_code == 400 and e.value.body["message"]


LONG = {"type": "object", "properties": {f"required_field_number_{i}": {"type": "string"} for i in range(12)},
        "additionalProperties": False}
LONG["required"] = list(LONG["properties"])


def _schema(schema, name="x"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def test_a_schema_whose_shortest_answer_cannot_fit_is_refused_naming_the_minimum(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Fill it in."}],
                                       max_tokens=10, response_format=_schema(LONG))
    body = e.value.body
    assert e.value.status_code == 400 and body["param"] == "max_tokens"
    assert "max_tokens" in body["message"] and "at least" in body["message"]
    need = int(body["message"].rsplit("at least ", 1)[1].split()[0])
    assert need > 10
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Fill it in."}],
                                       max_tokens=need + 8, temperature=0, response_format=_schema(LONG))
    assert r.choices[0].finish_reason == "stop"     # the default wrap-up fits it in what the minimum named
    jsonschema.validate(json.loads(r.choices[0].message.content), LONG)


def test_the_default_server_finishes_json_inside_a_small_max_tokens(client):
    """The packaged model's wrap-up is on by default: a long-winded answer still ends as valid JSON."""
    for fmt in ({"type": "json_object"}, _schema({"type": "object", "properties": {
            "story": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["story", "tags"]})):
        for stream in (False, True):
            kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell a long story about a cat."}],
                      max_tokens=24, temperature=0, response_format=fmt)
            if stream:
                chunks = list(client.chat.completions.create(**kw, stream=True))
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish = chunks[-1].choices[0].finish_reason
            else:
                r = client.chat.completions.create(**kw)
                text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            assert finish == "stop" and isinstance(json.loads(text), dict)


def test_an_answer_cut_inside_json_is_counted_when_wrap_up_is_turned_off():
    """A cut by construction: logit_bias +100 on the one-character tokens 'a' and 'b' makes every sampled token
    one of them (the loop breaker bans at most one a step), so 30 tokens hold under 200 characters of story and
    the grammar cannot close it (minLength 200), whatever the model would have written (its vocabulary has tokens
    of up to 81 characters)."""
    import httpx

    from tests.conftest import live_server
    from tokenomy.structured.token_tables import load_tokenizer

    one_char = [load_tokenizer().tokenize_str(ch) for ch in "ab"]      # the packaged SmolLM2's vocabulary
    assert all(len(ids) == 1 for ids in one_char), one_char
    cfg = {"models": [{"name": MODEL, "structured": {"wrap_up": None, "max_array_items": None}}]}
    with live_server(cfg) as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A long story."}],
                                      max_tokens=30, temperature=0, logit_bias={str(ids[0]): 100 for ids in one_char},
                                      response_format=_schema({"type": "object", "properties": {
                                          "story": {"type": "string", "minLength": 200}}, "required": ["story"]}))
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 30
        content = r.choices[0].message.content
        assert content.startswith('{"story": "') and set(content[len('{"story": "'):]) <= set("ab"), content
        with pytest.raises(json.JSONDecodeError):
            json.loads(content)
        metrics = httpx.get(srv.root + "/metrics").text
        assert f'tokenomy_schema_cut_total{{model="{MODEL}"}} 1.0' in metrics

"""Ollama bodies -> the internal request, and the pipeline's deltas -> Ollama's NDJSON lines (tokenomy/dialect/
ollama.py, ollama_wire.py), without a model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tokenomy.config import keep_alive_seconds
from tokenomy.dialect.ollama import ChatRequest, GenerateRequest, body_error
from tokenomy.dialect.ollama_wire import NS, LineWriter
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.pipeline.request import RequestContext


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), ("0", 0.0), (300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5),
    ("250ms", 0.25), ("1500us", 0.0015), (-1, None), ("-1", None), ("-1m", None)])
def test_keep_alive_is_a_number_of_seconds_or_a_go_duration(value, seconds):
    assert keep_alive_seconds(value) == pytest.approx(seconds) if seconds is not None else \
        keep_alive_seconds(value) is None
    gen = GenerateRequest.model_validate({"model": "m", "keep_alive": value}).gen_request("m")
    assert gen.params["keep_alive"] == value            # the fleet reads it when the request ends


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m", "", {}, [5], True])
def test_a_keep_alive_that_is_no_duration_is_refused(value):
    with pytest.raises(ValueError, match="keep_alive"):
        keep_alive_seconds(value)
    with pytest.raises(ValidationError, match="keep_alive"):
        ChatRequest.model_validate({"model": "m", "keep_alive": value})


def test_a_null_keep_alive_is_no_keep_alive():
    assert "keep_alive" not in ChatRequest.model_validate({"model": "m", "keep_alive": None}).gen_request("m").params


def test_options_map_to_the_engines_sampling_and_unknown_ones_are_ignored():
    body = GenerateRequest.model_validate({"model": "m", "prompt": "p", "options": {
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n"], "num_predict": 9,
        "num_ctx": 4096, "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "mirostat": 2, "num_gpu": 99}})
    gen = body.gen_request("m")
    assert gen.params == {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n"],
                          "max_tokens": 9, "repetition_penalty": 1.1, "presence_penalty": 0.5,
                          "frequency_penalty": 0.25}
    assert gen.api == "ollama.generate" and gen.kind == "chat" and gen.messages == [{"role": "user", "content": "p"}]
    unlimited = GenerateRequest.model_validate({"model": "m", "prompt": "p", "options": {"num_predict": -1}})
    assert "max_tokens" not in unlimited.gen_request("m").params


def test_generate_system_raw_suffix_and_format():
    sys_ = GenerateRequest.model_validate({"model": "m", "prompt": "p", "system": "s", "format": "json"}) \
        .gen_request("m")
    assert sys_.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "p"}]
    assert sys_.response_format == {"type": "json_object"}
    raw = GenerateRequest.model_validate({"model": "m", "prompt": "<s>p", "raw": True}).gen_request("m")
    assert raw.kind == "completion" and raw.prompt == "<s>p"
    fim = GenerateRequest.model_validate({"model": "m", "prompt": "a", "suffix": "b"}).gen_request("m", ("P", "S", "M"))
    assert fim.kind == "completion" and fim.prompt == "PaSbM"
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = ChatRequest.model_validate({"model": "m", "messages": [], "format": schema}).response_format()
    assert fmt == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def test_tool_calls_get_ids_and_each_tool_turn_answers_its_call():
    body = ChatRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "content": "12:00", "tool_name": "get_time"},
        {"role": "tool", "content": "sunny"}]})
    messages = body.gen_request("m").messages
    calls = messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert messages[2]["tool_call_id"] == "call_1" and messages[3]["tool_call_id"] == "call_0"


@pytest.mark.parametrize(("body", "field"), [
    ({"model": "m", "prompt": "p", "template": "{{ .Prompt }}"}, "template"),
    ({"model": "m", "prompt": "p", "context": [1, 2]}, "context"),
    ({"model": "m", "prompt": "p", "format": "yaml"}, "format"),
    ({"model": "m", "prompt": "p", "format": "json", "raw": True}, "format"),
    ({"model": "m", "prompt": "p", "keep_alive": "soon"}, "keep_alive"),
    ({"prompt": "p"}, "model")])
def test_what_is_refused_is_a_400_that_names_it(body, field):
    with pytest.raises(ValidationError) as e:
        GenerateRequest.model_validate(body)
    err = body_error(e.value.errors())
    assert err.status == 400 and field in err.message


def test_a_stream_is_text_lines_then_one_done_line_with_the_calls_and_measured_durations():
    ctx = RequestContext(gen=GenRequest(model="m"), stream=True)
    writer = LineWriter(ctx, "m:latest", chat=True)
    usage = Usage(prompt_tokens=5, completion_tokens=3, queue_s=0.1, ttft_s=0.3, e2e_s=0.6)
    lines = writer.chunks(Delta(text="Hi"))
    first = {"index": 0, "id": "call_a", "function": {"name": "f", "arguments": '{"x"'}}
    lines += writer.chunks(Delta(tool_calls=[first]))
    lines += writer.chunks(Delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]))
    lines += writer.chunks(Delta(finish_reason="tool_calls", usage=usage))
    objs = [json.loads(x) for x in lines]
    assert [o["done"] for o in objs] == [False, True] and objs[0]["message"]["content"] == "Hi"
    last = objs[-1]
    assert last["message"]["tool_calls"] == [{"id": "call_a", "function": {"index": 0, "name": "f",
                                                                           "arguments": {"x": 1}}}]
    assert last["done_reason"] == "stop" and last["prompt_eval_count"] == 5 and last["eval_count"] == 3
    assert last["prompt_eval_duration"] == pytest.approx(0.2 * NS, rel=1e-6)
    assert last["eval_duration"] == pytest.approx(0.3 * NS, rel=1e-6)
    assert last["total_duration"] > 0 and last["load_duration"] == 0
    cut = LineWriter(ctx, "m", chat=False).chunks(Delta(text="a", finish_reason="length", usage=usage))
    assert json.loads(cut[-1])["done_reason"] == "length" and json.loads(cut[0])["response"] == "a"
    usage.load_s = 0.25                 # the request waited for its model's load (backends/fleet.py)
    loaded = LineWriter(ctx, "m", chat=False).chunks(Delta(text="a", finish_reason="stop", usage=usage))
    assert json.loads(loaded[-1])["load_duration"] == pytest.approx(0.25 * NS, rel=1e-6)
    failed = LineWriter(ctx, "m", chat=False).chunks(Delta(error="engine died"))
    assert json.loads(failed[0]) == {"error": "engine died"}

"""Custom tools in the Responses dialect: the tool, tool_choice and input items mapped to the internal chat shape,
and a custom call's output item and stream events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenomy.dialect.responses import ResponsesRequest, assistant_message
from tokenomy.dialect.responses_wire import ResponseEvents, output_items
from tokenomy.errors import APIError
from tokenomy.generation import Delta, GenRequest, Usage
from tokenomy.pipeline.request import RequestContext

REGEX = {"type": "custom", "name": "code", "description": "digits",
         "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]{3}"}}


def body(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "Hi", **kw})


def test_a_custom_tool_and_its_choice_map_to_chats_shape():
    gen = body(tools=[REGEX, {"type": "custom", "name": "note"}], tool_choice={"type": "custom", "name": "code"}
               ).gen_request()
    assert gen.tools == [
        {"type": "custom", "custom": {"name": "code", "description": "digits", "format": {
            "type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]{3}"}}}},
        {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}]
    assert gen.tool_choice == {"type": "custom", "custom": {"name": "code"}}
    allowed = body(tools=[REGEX], tool_choice={"type": "allowed_tools", "mode": "required",
                                               "tools": [{"type": "custom", "name": "code"}]}).gen_request()
    assert allowed.tools == gen.tools[:1] and allowed.tool_choice == "required"


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "ebnf",
                                                          "definition": "a"}}]}, "tools[0].format.syntax"),
    ({"tools": [{"type": "custom", "name": "x", "format": {"type": "json"}}]}, "tools[0].format.type"),
    ({"tools": [{"type": "custom"}]}, "tools[0].name"),
    ({"tools": [REGEX], "tool_choice": {"type": "custom", "name": "other"}}, "tool_choice"),
    ({"tools": [{"type": "frobnicate"}]}, "tools[0].type"),
])
def test_what_cannot_be_served_is_a_400_naming_it(kw, param):
    with pytest.raises(APIError) as e:
        body(**kw).gen_request()
    assert e.value.status == 400 and e.value.param == param


def test_custom_call_items_continue_as_a_call_and_its_output():
    req = body(input=[{"type": "custom_tool_call", "call_id": "call_1", "name": "code", "input": "123"},
                      {"type": "custom_tool_call_output", "call_id": "call_1", "output": "ringing"}])
    assert req.input_messages() == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "custom", "custom": {"name": "code", "input": "123"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ringing"}]
    with pytest.raises(APIError) as e:
        body(input=[{"type": "custom_tool_call", "call_id": "call_1", "name": "code"}]).input_messages()
    assert e.value.param == "input[0].input"
    call = {"id": "call_2", "type": "custom", "custom": {"name": "code", "input": "42"}}
    assert assistant_message("", [call])["tool_calls"] == [call]
    [item] = output_items("", [call], "completed")
    assert item["id"].startswith("ctc_") and {k: v for k, v in item.items() if k != "id"} == {
        "type": "custom_tool_call", "call_id": "call_2", "name": "code", "input": "42"}


def test_a_streamed_custom_call_is_its_item_input_deltas_and_done():
    ctx = RequestContext(gen=GenRequest(model="m", api="responses"), request_id="req_abc")
    ev = ResponseEvents(ctx, body(tools=[REGEX]), stored=False)
    raw = ev.chunks(Delta(tool_calls=[{"index": 0, "id": "call_9", "type": "custom",
                                       "custom": {"name": "code", "input": ""}}]))
    raw += ev.chunks(Delta(tool_calls=[{"index": 0, "custom": {"input": "12"}}]))
    raw += ev.chunks(Delta(tool_calls=[{"index": 0, "custom": {"input": "3"}}]))
    raw += ev.chunks(Delta(finish_reason="tool_calls", usage=Usage(prompt_tokens=3, completion_tokens=4)))
    raw += ev.end()
    events = [json.loads(chunk.decode().split("data: ", 1)[1]) for chunk in raw]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done", "response.output_item.done", "response.completed"]
    assert events[5]["input"] == "123" and events[6]["item"]["input"] == "123"
    assert events[-1]["response"]["output"] == [events[6]["item"]] and events[-1]["response"]["tools"] == [REGEX]
    assert ev.tool_calls == [{"id": "call_9", "type": "custom", "custom": {"name": "code", "input": "123"}}]

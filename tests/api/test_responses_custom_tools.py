"""Custom tools on /v1/responses through the official openai client, unchanged, on a live tokenomy with the real
SmolLM2 model: a regex or Lark grammar constrains the call's input (whatever the model would rather write),
`custom_tool_call` items and their stream events, the output fed back, and 400s that name what is refused."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from tests.helpers.answers import assert_response_end

pytestmark = pytest.mark.slow       # a real engine, client or process (docs/testing.md)

MODEL = "smollm2-135m-instruct"
AREA_CODE: Any = {"type": "custom", "name": "area_code", "description": "Dial a telephone area code",
                  "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]{3}"}}
SUM: Any = {"type": "custom", "name": "add", "description": "Add numbers",
            "format": {"type": "grammar", "syntax": "lark",
                       "definition": 'start: expr\nexpr: NUMBER (" + " NUMBER)+\nNUMBER: /[0-9]{1,4}/'}}
FORCED: Any = {"type": "custom", "name": "area_code"}


def test_a_regex_grammar_constrains_a_forced_custom_call(client):
    r = client.responses.create(model=MODEL, input="Dial the area code of New York.", tools=[AREA_CODE],
                                tool_choice=FORCED, max_output_tokens=40, temperature=0)
    [call] = r.output
    assert call.type == "custom_tool_call" and call.name == "area_code" and call.call_id.startswith("call_")
    assert re.fullmatch(r"[0-9]{3}", call.input) and r.status == "completed"
    assert r.tools[0].type == "custom" and r.tools[0].name == "area_code"
    events = list(client.responses.create(model=MODEL, input="Dial the area code of New York.", tools=[AREA_CODE],
                                          tool_choice=FORCED, max_output_tokens=40, temperature=0.7, stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.custom_tool_call_input.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[3:-3]) == {"response.custom_tool_call_input.delta"}
    streamed = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    [item] = events[-1].response.output
    assert re.fullmatch(r"[0-9]{3}", streamed) and streamed == events[-3].input == item.input


def test_a_lark_grammar_constrains_the_input_and_the_output_continues_the_turn(client):
    r = client.responses.create(model=MODEL, input="Add two and three.", tools=[SUM], tool_choice="required",
                                max_output_tokens=40, temperature=0)
    [call] = r.output
    assert call.type == "custom_tool_call" and re.fullmatch(r"[0-9]{1,4}( \+ [0-9]{1,4})+", call.input)
    out = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "5"}
    reply = client.responses.create(model=MODEL, previous_response_id=r.id, input=[out], tools=[SUM],
                                    tool_choice="none", max_output_tokens=12, temperature=0)
    assert [o.type for o in reply.output] == ["message"]
    assert_response_end(reply, 12)
    again = client.responses.create(model=MODEL, input=[
        {"type": "message", "role": "user", "content": "Add two and three."},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "add", "input": call.input}, out],
        tools=[SUM], tool_choice="none", max_output_tokens=4)
    assert again.usage.input_tokens > 0 and again.output[0].type == "message"


@pytest.mark.parametrize("tools, choice, param", [
    ([{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "lark", "definition": "start: ("}}],
     "required", "tools"),
    ([{"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "pcre", "definition": "a"}}],
     "auto", "tools[0].format.syntax"),
    ([AREA_CODE], {"type": "custom", "name": "other"}, "tool_choice"),
    ([{"type": "frobnicate", "name": "x"}], "auto", "tools[0].type"),
])
def test_what_cannot_be_served_is_a_400_that_names_it(client, tools, choice, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="Hi", tools=tools, tool_choice=choice, max_output_tokens=4)
    assert e.value.body["param"] == param

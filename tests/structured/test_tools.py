import json
import re

import pytest

from tokenomy.structured.tools import ToolCallStream, parse_tool_calls, tools_prompt

TWO = ('<tool_call>[{"name":"get_weather","arguments":{"city":"Pa\\"ris}"}},'
       '{"name":"get_time","arguments":{}}]</tool_call>')


def test_parse_tool_calls():
    calls = parse_tool_calls(TWO)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) and c["type"] == "function" for c in calls)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": 'Pa"ris}'}
    assert calls[1]["function"]["arguments"] == "{}"
    assert calls[0]["id"] != calls[1]["id"]
    assert parse_tool_calls("It is sunny in Paris.") == []
    with pytest.raises(ValueError, match="incomplete"):
        parse_tool_calls('<tool_call>[{"name":"get_weather","argum')
    with pytest.raises(ValueError, match="name"):
        parse_tool_calls('<tool_call>[{"arguments":{}}]</tool_call>')


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_stream_deltas_rebuild_the_same_calls(size):
    stream = ToolCallStream()
    content, deltas = "", []
    for i in range(0, len(TWO), size):
        c, d = stream.feed(TWO[i:i + size])
        content += c
        deltas += d
    c, d = stream.close()
    assert content + c == "" and not d and stream.finished
    # Accumulate as an OpenAI client does: the first delta of an index carries id/type/name.
    built: dict[int, dict] = {}
    for d in deltas:
        call = built.setdefault(d["index"], {"id": d.get("id"), "name": d.get("function", {}).get("name"),
                                             "arguments": ""})
        assert set(d) <= {"index", "id", "type", "function"}
        call["arguments"] += d["function"].get("arguments", "")
    assert [b["name"] for b in built.values()] == ["get_weather", "get_time"]
    assert all(b["id"].startswith("call_") for b in built.values())
    assert [json.loads(b["arguments"]) for b in built.values()] == [{"city": 'Pa"ris}'}, {}]
    assert [c["function"]["arguments"] for c in stream.calls] == [b["arguments"] for b in built.values()]


def test_stream_passes_text_through_and_holds_only_a_possible_opening():
    s = ToolCallStream()
    assert s.feed("<to") == ("", [])
    assert s.feed("day is fine") == ("<today is fine", [])
    assert s.feed(" and warm") == (" and warm", [])
    t = ToolCallStream()
    assert t.feed("<tool") == ("", [])
    assert t.close() == ("<tool", [])


def test_stream_cut_short_keeps_partial_arguments():
    s = ToolCallStream()
    _, deltas = s.feed('<tool_call>[{"name":"get_weather","arguments":{"ci')
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert deltas[-1]["function"]["arguments"] == '{"ci'
    assert not s.finished


def test_tools_prompt_names_every_tool_and_the_convention():
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "get_time")]
    text = tools_prompt(tools)
    assert "get_weather" in text and "get_time" in text and "<tool_call>" in text and "</tool_call>" in text

"""A Responses API body becomes the internal chat request: items to messages, tools by type, formats, and a 400
naming what cannot be served."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tokenomy.dialect.responses import ResponsesRequest, assistant_message, input_items
from tokenomy.errors import APIError

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**kw: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "Hi", **kw})


def refused(**kw: Any) -> APIError:
    with pytest.raises(APIError) as e:
        body(**kw).gen_request()
    assert e.value.status == 400
    return e.value


def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    g = body(instructions="Be brief.", max_output_tokens=5, temperature=0, top_p=0.5, user="u1").gen_request()
    assert (g.kind, g.api, g.model) == ("chat", "responses", "m")
    assert g.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert g.params == {"max_tokens": 5, "temperature": 0, "top_p": 0.5} and g.user == "u1"
    assert g.tools is None and g.tool_choice is None and g.response_format is None


def test_items_become_messages_and_history_goes_between_instructions_and_input():
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
    ]
    history = [{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}]
    g = body(instructions="Sys.", input=items).gen_request(history)
    assert g.messages == [
        {"role": "system", "content": "Sys."}, *history,
        {"role": "system", "content": "Rules."}, {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
    ]


def test_bad_items_are_a_400_naming_the_item():
    assert refused(input=[{"type": "bogus"}]).param == "input[0].type"
    image = refused(input=[{"role": "user", "content": [{"type": "input_text", "text": "see"},
                                                        {"type": "input_image", "image_url": "http://x/y.png"}]}])
    assert image.param == "input[0].content[1].type" and "input_image" in image.message
    assert refused(input=[{"role": "robot", "content": "x"}]).param == "input[0].role"
    assert refused(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]).param == "input[0].call_id"
    assert refused(input=[{"content": "no role, no type"}]).param == "input[0]"
    assert refused(input=[]).param == "input"
    assert refused(input=[{"type": "reasoning", "summary": []}]).param == "input"   # nothing left to answer


def test_a_tool_output_must_answer_a_call_made_before_it():
    output = {"type": "function_call_output", "call_id": "call_9", "output": "x"}
    e = refused(input=[{"role": "user", "content": "Hi"}, output])
    assert e.param == "input" and "No tool call found for function call output with call_id call_9" in e.message
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    g = body(input=[output]).gen_request([{"role": "user", "content": "Hi"}, call])   # the call in the history
    assert g.messages[-1] == {"role": "tool", "tool_call_id": "call_9", "content": "x"}


def test_function_and_custom_tools_are_honoured_codex_tools_ignored_hosted_tools_refused():
    codex = [WEATHER, {"type": "web_search", "external_web_access": False}, {"type": "local_shell"},
             {"type": "custom", "name": "apply_patch", "description": "d",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]
    g = body(tools=codex, tool_choice="auto", parallel_tool_calls=False).gen_request()
    assert g.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city", "parameters": WEATHER["parameters"],
        "strict": True}}, {"type": "custom", "custom": {"name": "apply_patch", "description": "d", "format": {
            "type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}}}]
    assert g.tool_choice == "auto" and g.params["parallel_tool_calls"] is False
    only_ignored = body(tools=codex[1:3], tool_choice="auto").gen_request()
    assert only_ignored.tools is None and only_ignored.tool_choice is None
    for kind in ("file_search", "code_interpreter", "mcp", "image_generation", "computer_use_preview", "teleport"):
        e = refused(tools=[WEATHER, {"type": kind}])
        assert e.param == "tools[1].type" and kind in e.message and e.code == "unsupported_tool"


def test_tool_choice_maps_to_chats_shape():
    g = body(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}).gen_request()
    assert g.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    narrowed = body(tools=[WEATHER, {**WEATHER, "name": "other"}], tool_choice={
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]}).gen_request()
    assert [t["function"]["name"] for t in narrowed.tools] == ["other"] and narrowed.tool_choice == "required"
    assert refused(tools=[WEATHER], tool_choice={"type": "function", "name": "nope"}).param == "tool_choice"
    assert refused(tools=[{"type": "web_search"}], tool_choice="required").param == "tool_choice"
    assert refused(tools=[WEATHER], tool_choice={"type": "web_search_preview"}).param == "tool_choice"
    with pytest.raises(ValidationError):
        body(tool_choice="sometimes")


def test_text_formats_become_response_formats():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    g = body(text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True},
                   "verbosity": "low"}).gen_request()
    assert g.response_format == {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                        "strict": True}}
    assert body(text={"format": {"type": "json_object"}}).gen_request().response_format == {"type": "json_object"}
    assert body(text={"format": {"type": "text"}}).gen_request().response_format is None
    assert refused(text={"format": {"type": "json_schema", "name": "x"}}).param == "text.format.schema"
    assert refused(text={"format": {"type": "yaml"}}).param == "text.format.type"


def test_fields_codex_sends_are_accepted_and_background_and_prompt_refused():
    codex = body(store=False, stream=True, include=["reasoning.encrypted_content"], prompt_cache_key="sess-1",
                 reasoning={"effort": "medium", "summary": "auto"}, client_metadata={"x": "y"},
                 service_tier="auto", truncation="auto")
    assert not codex.wants_store(True) and codex.gen_request().user == "sess-1"
    assert body().wants_store(True) and not body().wants_store(False)      # default true, never without a store
    with pytest.raises(ValidationError, match="background"):
        body(background=True)
    assert refused(conversation="conv_1", previous_response_id="resp_1").param == "conversation"
    assert refused(prompt={"id": "pmpt_1"}).param == "prompt"
    with pytest.raises(ValidationError):
        body(metadata={str(i): "v" for i in range(17)})
    with pytest.raises(ValidationError):
        body(temperature="hot")


def test_the_answer_and_the_input_as_stored():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}, "index": 0}
    assert assistant_message("", [call]) == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert assistant_message("Hi", None) == {"role": "assistant", "content": "Hi"}
    items = input_items(body(input=[{"role": "user", "content": "x"}, {"type": "reasoning", "summary": []},
                                    {"type": "function_call_output", "call_id": "c", "output": "o", "id": "fco_9"}]),
                        lambda prefix: prefix + "1")
    assert items == [{"role": "user", "content": [{"type": "input_text", "text": "x"}], "type": "message",
                      "status": "completed", "id": "msg_1"},
                     {"type": "function_call_output", "call_id": "c", "output": "o", "id": "fco_9"}]


def test_a_compaction_item_is_its_summary_as_a_system_message():
    from tokenomy.context.compaction import SUMMARY_HEADER

    msgs = body(input=[{"type": "compaction", "encrypted_content": "Ada lives in Paris."},
                       {"role": "user", "content": "Where?"}]).input_messages()
    assert msgs == [{"role": "system", "content": f"{SUMMARY_HEADER} Ada lives in Paris."},
                    {"role": "user", "content": "Where?"}]
    assert refused(input=[{"type": "compaction"}]).param == "input[0].encrypted_content"

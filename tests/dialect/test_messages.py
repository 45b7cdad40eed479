"""The Messages dialect without a server: a body's mapping to the internal request, the refusals and their wording,
and the answer's usage, stop reason and stream events built from deltas."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tokenomy.dialect.messages import MessagesRequest, body_error
from tokenomy.dialect.messages_wire import EventWriter, message_body, stop_reason, usage_body
from tokenomy.generation import MAX_MESSAGES, MAX_OUTPUT_TOKENS, Delta, GenRequest, Usage
from tokenomy.pipeline.request import RequestContext, Result

EPHEMERAL = {"type": "ephemeral"}
BASE = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def refusal(body: dict) -> str:
    with pytest.raises(ValidationError) as e:
        MessagesRequest.model_validate(body)
    err = body_error(e.value.errors())
    assert err.status == 400
    return err.message


def test_a_conversation_with_tools_maps_to_openai_shaped_messages():
    body = MessagesRequest.model_validate({
        **BASE, "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.",
                                                                    "cache_control": EPHEMERAL}],
        "tools": [{"name": "get", "description": "Fetch.", "cache_control": EPHEMERAL,
                   "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["END"],
        "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u1"}, "thinking": {"type": "enabled"},
        "messages": [
            {"role": "user", "content": "Find cats."},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                              {"type": "text", "text": "Looking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get",
                                               "input": {"q": "cats"}},
                                              {"type": "tool_use", "id": "toolu_2", "name": "get",
                                               "input": {"q": "dogs"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 cats"},
                                         {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                          "content": [{"type": "text", "text": "timeout"}]},
                                         {"type": "text", "text": "Go on."}]}]})
    gen = body.gen_request()
    assert gen.kind == "chat" and gen.api == "messages" and gen.user == "u1"
    assert gen.messages == [
        {"role": "system", "content": "Be brief.\n\nUse tools.", "cache_control": EPHEMERAL},
        {"role": "user", "content": "Find cats."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": '{"q": "cats"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get", "arguments": '{"q": "dogs"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "3 cats"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "Go on."}]
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert gen.tools == [{"type": "function", "cache_control": EPHEMERAL,
                          "function": {"name": "get", "description": "Fetch.", "parameters": schema}}]
    assert gen.tool_choice == "required"
    assert gen.params == {"max_tokens": 8, "temperature": 0.5, "top_k": 5, "stop": ["END"],
                          "parallel_tool_calls": False}


@pytest.mark.parametrize(("choice", "internal"), [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get"}, {"type": "function", "function": {"name": "get"}})])
def test_tool_choices(choice, internal):
    tools = [{"name": "get", "input_schema": {"type": "object"}}]
    assert MessagesRequest.model_validate({**BASE, "tools": tools, "tool_choice": choice}).gen_request().tool_choice \
        == internal


def test_a_request_level_cache_control_marks_the_last_message_and_output_format_is_a_json_schema():
    gen = MessagesRequest.model_validate({**BASE, "cache_control": EPHEMERAL, "output_config": {
        "effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}}}).gen_request()
    assert gen.messages == [{"role": "user", "content": "hi", "cache_control": EPHEMERAL}]
    assert gen.response_format == {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": {"type": "object"}, "strict": True}}


def test_refusals_name_the_field_as_anthropic_does():
    assert refusal({k: v for k, v in BASE.items() if k != "max_tokens"}) == "max_tokens: Field required"
    assert refusal({**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}) == \
        "messages.0.content.0.text: Input should be a valid string"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert refusal({**BASE, "messages": [{"role": "user", "content": ["x", image]}]}).startswith(
        "messages.0.content.0: Input should be a valid dictionary")
    assert "reads text only" in refusal({**BASE, "messages": [{"role": "user", "content": [image]}]})
    assert "server tool 'bash_20250124'" in refusal({**BASE, "tools": [{"type": "bash_20250124", "name": "bash"}]})
    assert "type 'object'" in refusal({**BASE, "tools": [{"name": "f", "input_schema": {"type": "array"}}]})
    assert "prefill" in refusal({**BASE, "messages": [{"role": "user", "content": "a"},
                                                      {"role": "assistant", "content": "b"}]})
    assert "not in tools" in refusal({**BASE, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                      "tool_choice": {"type": "tool", "name": "g"}})
    assert "assistant" in refusal({**BASE, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})


def test_usage_excludes_cache_reads_from_input_tokens_and_stop_reasons_map():
    assert usage_body(Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=7)) == {
        "input_tokens": 36, "output_tokens": 7, "cache_read_input_tokens": 64, "cache_creation_input_tokens": 0}
    assert stop_reason("stop", None, False) == ("end_turn", None)
    assert stop_reason("stop", "END", False) == ("stop_sequence", "END")
    assert stop_reason("length", None, False) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, True) == ("tool_use", None)


def test_a_message_body_has_text_and_tool_use_blocks():
    ctx = RequestContext(gen=GenRequest(model="m", api="messages"), model="small")
    ctx.result = Result(text="Calling.", finish_reason="tool_calls", usage=Usage(prompt_tokens=10, completion_tokens=5),
                        tool_calls=[{"id": "call_ab", "type": "function",
                                     "function": {"name": "get", "arguments": '{"q": "x"}'}}])
    body = message_body(ctx)
    assert body["id"].startswith("msg_") and body["model"] == "small" and body["stop_reason"] == "tool_use"
    assert body["content"] == [{"type": "text", "text": "Calling."},
                               {"type": "tool_use", "id": "toolu_ab", "name": "get", "input": {"q": "x"}}]


def test_stream_events_open_and_close_blocks_in_order():
    ctx = RequestContext(gen=GenRequest(model="m", api="messages"), prompt_tokens=12)
    w = EventWriter(ctx)
    deltas = [Delta(text="Let me check."),
              Delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                 "function": {"name": "get", "arguments": ""}}]),
              Delta(tool_calls=[{"index": 0, "function": {"arguments": '{"q": '}}]),
              Delta(tool_calls=[{"index": 0, "function": {"arguments": '"x"}'}}]),
              Delta(finish_reason="tool_calls", usage=Usage(prompt_tokens=12, cached_tokens=4, completion_tokens=9))]
    raw = b"".join(chunk for d in deltas for chunk in w.chunks(d)) + b"".join(w.end())
    events = [(e.split("\n")[0][7:], json.loads(e.split("\n")[1][6:])) for e in raw.decode().strip().split("\n\n")]
    assert [(n, d.get("index")) for n, d in events] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 12
    assert events[4][1]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {}}
    assert "".join(d["delta"]["partial_json"] for n, d in events[5:7]) == '{"q": "x"}'
    assert events[8][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[8][1]["usage"] == {"input_tokens": 8, "output_tokens": 9, "cache_read_input_tokens": 4,
                                     "cache_creation_input_tokens": 0}
    failed = EventWriter(ctx).chunks(Delta(error="boom", finish_reason="error"))
    assert failed[-1].startswith(b"event: error\n") and b'"type":"api_error"' in failed[-1]


def test_a_system_message_inside_the_conversation_stays_in_its_place():
    """Claude Code 2.1.3xx sends the session's environment as a `system` message after the user's turn."""
    body = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "You are terse."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]},
                     {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /tmp"}]}]})
    roles = [(m["role"], m["content"]) for m in body.gen_request().messages]
    assert roles == [("system", "You are terse."), ("user", "Say hello"), ("system", "# Environment\ncwd: /tmp")]
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}]})


def test_a_tool_result_with_no_earlier_tool_use_is_refused_as_anthropic_refuses_it():
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}
    with pytest.raises(ValidationError) as e:
        MessagesRequest.model_validate({**BASE, "messages": [orphan]})
    err = body_error(e.value.errors())
    assert err.status == 400 and err.message.startswith("messages.0.content.0: unexpected `tool_use_id`")
    assert "toolu_9" in err.message


def test_messages_and_max_tokens_are_bounded_with_a_400_naming_the_limit():
    many = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * (MAX_MESSAGES // 2) + [
        {"role": "user", "content": "z"}]
    for body, param, limit in (({**BASE, "messages": many}, "messages", MAX_MESSAGES),
                               ({**BASE, "max_tokens": 2**63}, "max_tokens", MAX_OUTPUT_TOKENS)):
        with pytest.raises(ValidationError) as e:
            MessagesRequest.model_validate(body)
        err = body_error(e.value.errors())
        assert err.status == 400 and err.param == param and str(limit) in err.message, err.message

"""Fitting's pieces: tools described briefly without changing what a call may be, and the first sentence."""

from __future__ import annotations

from tokenomy.context.window import MAX_BRIEF_CHARS, brief_tools, first_sentence
from tokenomy.structured import output_format
from tokenomy.structured.validate import validate_tool_calls


def test_first_sentence_is_short_and_from_the_first_paragraph():
    assert first_sentence("Runs a command. Use it with care.\n\nMore text.") == "Runs a command."
    assert first_sentence("No full stop here\nnext line") == "No full stop here next line"
    assert len(first_sentence("x" * 5000)) == MAX_BRIEF_CHARS


def test_brief_tools_drop_prose_but_keep_the_schema():
    schema = {"type": "object", "$schema": "http://json-schema.org/draft-07/schema#", "title": "Args",
              "properties": {"cmd": {"type": "string", "description": "Shell command. " * 50, "minLength": 1},
                             "description": {"type": "string", "description": "What it does."}},
              "required": ["cmd"], "additionalProperties": False}
    tools = [{"type": "function", "cache_control": {"type": "ephemeral"},
              "function": {"name": "bash", "description": "Runs a command in a shell. " + "More. " * 400,
                           "parameters": schema}}]
    brief = brief_tools(tools)
    fn = brief[0]["function"]
    assert fn["name"] == "bash" and fn["description"] == "Runs a command in a shell."
    assert brief[0]["cache_control"] == {"type": "ephemeral"}
    params = fn["parameters"]
    assert set(params["properties"]) == {"cmd", "description"}      # a property named description stays
    assert "description" not in params["properties"]["cmd"] and params["properties"]["cmd"]["minLength"] == 1
    assert "$schema" not in params and "title" not in params and params["required"] == ["cmd"]
    assert tools[0]["function"]["parameters"] is schema and "description" in schema["properties"]["cmd"]
    # the same calls are valid and invalid under both
    full, short = output_format(None, tools, "required").tools, output_format(None, brief, "required").tools
    good = [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]
    bad = [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": ""}'}}]
    assert validate_tool_calls(good, full).ok and validate_tool_calls(good, short).ok
    assert not validate_tool_calls(bad, full).ok and not validate_tool_calls(bad, short).ok


def test_cut_middle_cuts_the_longest_message_but_never_the_question_until_it_fits():
    from tokenomy.context.window import cut_middle

    def count(msgs):                          # four characters a token, as a tokenizer roughly counts
        return sum(len(m["content"]) for m in msgs) // 4

    system = "Rules first. " + "filler " * 2000 + "Closing rule."
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "q" * 3000},
            {"role": "user", "content": "the question " * 400}]
    out, cut = cut_middle(msgs, 2500, count)
    assert count(out) <= 2500 and cut > 0
    assert out[-1] == msgs[-1] and msgs[0]["content"] == system          # the question and the input untouched
    assert out[0]["content"].startswith("Rules first.") and out[0]["content"].endswith("Closing rule.")
    assert "characters left out to fit the model's context window" in out[0]["content"]
    # what cannot fit without touching the question stays over
    tiny = [{"role": "system", "content": "s" * 500}, {"role": "user", "content": "u" * 40000}]
    out, cut = cut_middle(tiny, 100, count)
    assert out[-1] == tiny[-1] and len(out[0]["content"]) >= 400
    # a long system message after the question (Claude Code's environment) is cut, the question is not
    after = [{"role": "user", "content": "Say hello"}, {"role": "system", "content": "env " * 5000}]
    out, cut = cut_middle(after, 1000, count)
    assert count(out) <= 1000 and out[0] == after[0] and cut > 0

"""Constrained greedy generation with the real SmolLM2: outputs validate, tool calls parse back."""

import json

from tests.helpers.shared_data import shared_data
from tests.structured.test_normalize import ONE_OF
from tokenomy.structured.constraint import Constraint
from tokenomy.structured.schema import json_schema_format, output_format, parse_tool_calls, tools_prompt
from tokenomy.structured.validate import validate, validate_output

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": {"type": "object", "properties": {"x": {"type": "number"},
                                                                                     "y": {"type": "number"}},
                                                     "required": ["x", "y"], "additionalProperties": False}}},
]


def _run(runner, compiler, fmt, system, user, max_tokens=96):
    c = Constraint(compiler.compile(fmt))
    return runner.generate(runner.chat_prompt(system, user), c, max_tokens), c


def _small_dev_schemas(n: int) -> list[dict]:
    with open(shared_data("jsonschema/dev.jsonl", "TOKENOMY_JSONSCHEMA_DATA")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["category"] == "Glaiveai2K"][:n]


def test_dev_schemas_generate_valid_json(runner, compiler):
    done = 0
    for row in _small_dev_schemas(3):
        schema = row["schema"]
        gen, c = _run(runner, compiler, json_schema_format(schema), "You answer with JSON only.",
                      "Write an example JSON document for this schema: " + json.dumps(schema), max_tokens=80)
        if gen.finish_reason == "length":
            continue  # cut answers are allowed to be incomplete; everything finished must validate
        done += 1
        assert c.is_complete()
        result = validate(gen.text, schema)
        assert result.ok, (row["id"], gen.text, result.errors)
    assert done >= 2


def test_fast_forward_saves_decode_calls(runner, compiler):
    schema = {"type": "object", "properties": {"first_name": {"type": "string", "maxLength": 20},
                                               "birth_year": {"type": "integer"}},
              "required": ["first_name", "birth_year"], "additionalProperties": False}
    gen, _ = _run(runner, compiler, json_schema_format(schema), "You answer with JSON only.",
                  "Ada Lovelace was born in 1815. Give her first name and birth year as JSON.")
    assert gen.finish_reason == "stop" and validate(gen.text, schema).ok, gen.text
    assert gen.forced > 0 and gen.decode_calls < len(gen.tokens)
    # A sampled token and the run the grammar forces after it share one llama_decode.
    assert gen.decode_calls <= len(gen.tokens) - gen.forced + 1  # +1: the opening run, fed before any sample


def test_json_object_mode(runner, compiler):
    gen, _ = _run(runner, compiler, output_format({"type": "json_object"}), "You answer with JSON only.",
                  'Tom is a cat. He is 3 years old. Answer as a JSON object like {"name": ..., "age": ...}.')
    assert gen.finish_reason == "stop", gen.text
    assert isinstance(json.loads(gen.text), dict)


def test_named_and_required_tool_calls(runner, compiler):
    system = tools_prompt(TOOLS)
    named = output_format(None, TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    gen, _ = _run(runner, compiler, named, system, "What is the weather in Paris?")
    calls = parse_tool_calls(gen.text)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
    assert validate_output(gen.text, named).ok

    required = output_format(None, TOOLS, "required")
    gen, _ = _run(runner, compiler, required, system, "Add 2 and 3.")
    calls = parse_tool_calls(gen.text)
    assert calls and {c["function"]["name"] for c in calls} <= {"get_weather", "add"}
    assert validate_output(gen.text, required).ok


def test_auto_answers_text_or_a_valid_call(runner, compiler):
    auto = output_format(None, TOOLS, "auto")
    gen, _ = _run(runner, compiler, auto, tools_prompt(TOOLS), "What is the weather in Rome?")
    assert validate_output(gen.text, auto).ok or gen.finish_reason == "length", gen.text
    calls = parse_tool_calls(gen.text) if gen.finish_reason == "stop" else []
    assert all(c["function"]["name"] in ("get_weather", "add") for c in calls)


def test_free_run_with_ignore_eos_decodes_exactly_max_tokens(runner):
    """The TPOT baseline: a free run times as many tokens as the constrained answer it is compared with."""
    gen = runner.generate(runner.chat_prompt("You are terse.", "Say hi."), None, 12, ignore_eos=True)
    assert len(gen.tokens) == 12 and gen.finish_reason == "length"
    assert gen.decode_calls == 11 and gen.forced == 0 and gen.tpot_ms > 0
    assert not set(gen.tokens) & runner.eog


def test_formerly_refused_recursive_schema_generates_valid_json(runner, compiler):
    """A recursive oneOf llguidance refuses as written compiles after the exact rewrites, and the answer the
    model writes under it validates against the original schema; wrap-up makes it end within max_tokens."""
    c = Constraint(compiler.compile(json_schema_format(ONE_OF)), soft_limit=32)
    gen = runner.generate(runner.chat_prompt("You answer with JSON only.", "Write a small tree of nodes and leaves "
                                             "as JSON: " + json.dumps(ONE_OF)), c, 64)
    assert gen.finish_reason == "stop", gen.text
    result = validate(gen.text, ONE_OF)
    assert result.ok, (gen.text, result.errors)

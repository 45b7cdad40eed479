"""Constrained greedy generation with the real SmolLM2: outputs validate, tool calls parse back.

Each constrained answer is started as the engine starts one (start_constraint, the packaged model's wrap-up share):
wrap-up promises an answer that ends inside max_tokens, so a test asserts `stop` and a valid document whatever
the model writes, instead of hoping a 135M model stops on its own (tests/helpers/answers.py).
"""

import json

from tests.helpers.shared_data import shared_data
from tests.structured.test_normalize import ONE_OF
from tokenomy.models.catalog import SMALL_MODEL_STRUCTURED
from tokenomy.structured.constraint import start_constraint
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


WRAP_UP = SMALL_MODEL_STRUCTURED["wrap_up"]     # the share the engine plans SmolLM2's answers with


def _run(runner, compiler, fmt, system, user, max_tokens=96):
    """A greedy answer under `fmt`, wrap-up planned for `max_tokens` as the engine plans it."""
    c = start_constraint(compiler.compile(fmt), max_tokens, wrap_up=WRAP_UP)
    return runner.generate(runner.chat_prompt(system, user), c, max_tokens), c


def _assert_ended_inside(gen, max_tokens):
    """Wrap-up's promise: the grammar finished (`stop`) before max_tokens, whatever the model wrote."""
    assert gen.finish_reason == "stop" and len(gen.tokens) <= max_tokens, (gen.finish_reason, len(gen.tokens),
                                                                          gen.text)


def _small_dev_schemas(n: int) -> list[dict]:
    with open(shared_data("jsonschema/dev.jsonl", "TOKENOMY_JSONSCHEMA_DATA")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["category"] == "Glaiveai2K"][:n]


def test_dev_schemas_generate_valid_json(runner, compiler):
    rows = _small_dev_schemas(3)
    assert len(rows) == 3
    for row in rows:
        schema = row["schema"]
        gen, c = _run(runner, compiler, json_schema_format(schema), "You answer with JSON only.",
                      "Write an example JSON document for this schema: " + json.dumps(schema), max_tokens=80)
        _assert_ended_inside(gen, 80)
        assert c.is_complete()
        result = validate(gen.text, schema)
        assert result.ok, (row["id"], gen.text, result.errors)


def test_fast_forward_saves_decode_calls(runner, compiler):
    schema = {"type": "object", "properties": {"first_name": {"type": "string", "maxLength": 20},
                                               "birth_year": {"type": "integer"}},
              "required": ["first_name", "birth_year"], "additionalProperties": False}
    gen, _ = _run(runner, compiler, json_schema_format(schema), "You answer with JSON only.",
                  "Ada Lovelace was born in 1815. Give her first name and birth year as JSON.")
    _assert_ended_inside(gen, 96)
    assert validate(gen.text, schema).ok, gen.text
    assert gen.forced > 0 and gen.decode_calls < len(gen.tokens)
    # A sampled token and the run the grammar forces after it share one llama_decode.
    assert gen.decode_calls <= len(gen.tokens) - gen.forced + 1  # +1: the opening run, fed before any sample


def test_json_object_mode(runner, compiler):
    gen, _ = _run(runner, compiler, output_format({"type": "json_object"}), "You answer with JSON only.",
                  'Tom is a cat. He is 3 years old. Answer as a JSON object like {"name": ..., "age": ...}.')
    _assert_ended_inside(gen, 96)
    assert isinstance(json.loads(gen.text), dict)


def test_named_and_required_tool_calls(runner, compiler):
    system = tools_prompt(TOOLS)
    named = output_format(None, TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    gen, _ = _run(runner, compiler, named, system, "What is the weather in Paris?")
    _assert_ended_inside(gen, 96)
    calls = parse_tool_calls(gen.text)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
    assert validate_output(gen.text, named).ok

    required = output_format(None, TOOLS, "required")
    gen, _ = _run(runner, compiler, required, system, "Add 2 and 3.")
    _assert_ended_inside(gen, 96)
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
    model writes under it validates against the original schema; wrap-up, planned for max_tokens, makes it end
    within them."""
    gen, _ = _run(runner, compiler, json_schema_format(ONE_OF), "You answer with JSON only.",
                  "Write a small tree of nodes and leaves as JSON: " + json.dumps(ONE_OF), max_tokens=64)
    _assert_ended_inside(gen, 64)
    result = validate(gen.text, ONE_OF)
    assert result.ok, (gen.text, result.errors)

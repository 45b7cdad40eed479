from __future__ import annotations

import pytest

from tokenomy.cache.key import (
    canonical_json,
    context_key,
    exact_key,
    is_deterministic,
    question_key,
)

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]


def test_exact_key_ignores_key_order_none_and_float_spelling() -> None:
    a = exact_key("t1", "small", MSGS, {"temperature": 0, "max_tokens": 10, "user": "bob"})
    b = exact_key("t1", "small", [{"content": m["content"], "role": m["role"], "name": None} for m in MSGS],
                  {"max_tokens": 10, "temperature": 0.0, "stream": True})
    assert a == b
    assert canonical_json({"b": 1.0, "a": [None, 2.5]}) == '{"a":[null,2.5],"b":1}'


@pytest.mark.parametrize("change", [
    {"tenant": "t2"}, {"model": "large"}, {"params": {"temperature": 0, "max_tokens": 11}},
    {"params": {"temperature": 0, "max_tokens": 10, "top_p": 0.5}},
    {"params": {"temperature": 0, "max_tokens": 10, "tools": [{"type": "function", "function": {"name": "f"}}]}},
    {"params": {"temperature": 0, "max_tokens": 10, "response_format": {"type": "json_object"}}},
    {"messages": [MSGS[0], {"role": "user", "content": "What is 2+3?"}]},
    {"messages": [{"role": "system", "content": "You are verbose."}, MSGS[1]]},
])
def test_exact_key_changes_with_everything_that_changes_output(change: dict) -> None:
    base = {"tenant": "t1", "model": "small", "messages": MSGS, "params": {"temperature": 0, "max_tokens": 10}}
    assert exact_key(**base) != exact_key(**{**base, **change})


def test_context_key_ignores_only_the_last_user_turn_and_sampling() -> None:
    other_q = [MSGS[0], {"role": "user", "content": "How much is two plus two?"}]
    assert context_key("t1", "small", MSGS, {"temperature": 0}) == context_key("t1", "small", other_q,
                                                                               {"temperature": 0.7, "seed": 3})
    assert context_key("t1", "small", MSGS) != context_key("t2", "small", MSGS)
    assert context_key("t1", "small", MSGS) != context_key("t1", "large", MSGS)
    longer = [MSGS[0], {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, MSGS[1]]
    assert context_key("t1", "small", MSGS) != context_key("t1", "small", longer)
    assert context_key("t1", "small", MSGS) != context_key("t1", "small", MSGS, {"response_format": {"type": "x"}})
    assert context_key("t1", "small", MSGS) != context_key("t1", "small", MSGS, {"max_tokens": 5})


def test_determinism_rule() -> None:
    assert is_deterministic({"temperature": 0})
    assert is_deterministic({"temperature": 0.0, "top_p": 0.9})
    assert is_deterministic({"temperature": 1.2, "seed": 7})
    assert not is_deterministic({"temperature": 0.2})
    assert not is_deterministic({})
    assert not is_deterministic(None)
    assert not is_deterministic({"temperature": 0, "n": 3})
    assert not is_deterministic({"temperature": False})


def test_bad_input_gives_clear_errors() -> None:
    with pytest.raises(TypeError, match="messages"):
        exact_key("t", "m", "hello", {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="params"):
        exact_key("t", "m", MSGS, ["temperature"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-finite"):
        exact_key("t", "m", MSGS, {"temperature": float("nan")})
    with pytest.raises(TypeError, match="cannot hash"):
        exact_key("t", "m", MSGS, {"x": object()})


def test_question_key_ignores_case_spacing_and_a_final_mark_only() -> None:
    assert question_key("What is the capital of France?") == question_key("  what is the capital   of france")
    assert question_key("Compute 2+2.") == question_key("compute 2+2")
    assert question_key("What is 2+2?") != question_key("What is 2-2?")  # inner punctuation still counts
    assert question_key("Is it 5!") != question_key("Is it 5")

"""Compaction: what it never touches, stable boundaries, cached incremental summaries, tool-output masking."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tokenomy.config import CompactionSettings
from tokenomy.context.compaction import SUMMARY_HEADER, SummaryCache, compact, split_turns


def count(msgs: list[dict[str, Any]]) -> int:            # a word count stands in for a tokenizer here
    return sum(len(str(m.get("content") or "").split()) + 3 for m in msgs)


def conversation(turns: int, tools: bool = False) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i} " + "word " * 20})
        if tools:
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": "{}"}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "result " * 40})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "word " * 20})
    return msgs


def settings(**kw: Any) -> CompactionSettings:
    return CompactionSettings(**{"trigger_tokens": 300, "keep_last_turns": 3, **kw})


class CountingSummarizer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, text: str, n: int) -> tuple[str, float]:
        self.calls.append(text)
        return f"summary of {text.count('user:')} user turns", 0.001


def test_drop_middle_keeps_system_last_turns_and_tool_pairs() -> None:
    msgs = conversation(12, tools=True)
    out = asyncio.run(compact(msgs, settings(trigger_tokens=600), count))
    assert out.action == "drop_middle" and out.turns_replaced > 0
    assert out.messages[0]["content"].startswith("You are a careful assistant.")
    head, turns = split_turns(msgs)
    assert out.messages[-12:] == [m for t in turns[-3:] for m in t]
    ids = [m["tool_call_id"] for m in out.messages if m.get("role") == "tool"]
    calls = [c["id"] for m in out.messages for c in m.get("tool_calls") or []]
    assert ids == calls                                     # every call kept has its result, and vice versa
    assert count(out.messages) <= 600


def test_under_the_trigger_nothing_changes() -> None:
    msgs = conversation(2)
    assert asyncio.run(compact(msgs, settings(), count)).messages is msgs


def test_summaries_are_cached_and_reused_on_the_next_turn() -> None:
    s = settings(trigger_tokens=600, strategy="summarize", summary_model="m", max_summary_tokens=32)
    cache, summarize = SummaryCache(), CountingSummarizer()
    first = asyncio.run(compact(conversation(14), s, count, summarize, cache))
    assert first.summary_calls == 1 and len(summarize.calls) == 1 and SUMMARY_HEADER in first.messages[0]["content"]
    msgs = conversation(15)                                  # the next turn of the same conversation
    second = asyncio.run(compact(msgs, s, count, summarize, cache))
    assert len(summarize.calls) == 1 and second.summary_cached and second.turns_replaced == first.turns_replaced
    assert second.messages[0] == first.messages[0]         # same prefix: the prefix cache still hits
    for n in range(16, 31):                                  # further on, the boundary moves a block at a time
        asyncio.run(compact(conversation(n), s, count, summarize, cache))
    assert 1 < len(summarize.calls) <= 1 + (30 - 15) // 2
    assert SUMMARY_HEADER in summarize.calls[-1]             # incremental: the last summary builds on the previous


def test_tool_outputs_are_masked_first_and_calls_stay() -> None:
    msgs = conversation(8, tools=True)
    out = asyncio.run(compact(msgs, settings(trigger_tokens=700, mask_tool_outputs=True), count))
    assert out.action == "masked" and out.tools_masked >= 3
    assert len(out.messages) == len(msgs)
    assert all("tool output omitted" in m["content"] for m in out.messages[:10] if m.get("role") == "tool")
    assert out.messages[-2]["content"].startswith("result")      # the last turns keep their outputs


def test_summarize_without_a_model_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="summary_model"):
        CompactionSettings(trigger_tokens=300, strategy="summarize")


def test_config_refuses_an_unknown_summary_model_and_a_bad_compress_model() -> None:
    from pydantic import ValidationError

    from tokenomy.config import Config

    route = {"models": ["smollm2-135m-instruct"], "context": {"compaction": {
        "trigger_tokens": 500, "strategy": "summarize", "summary_model": "nope"}}}
    with pytest.raises(ValidationError, match="summary_model"):
        Config.model_validate({"routes": {"r": route}})
    with pytest.raises(ValidationError, match="packaged model"):
        Config.model_validate({"routes": {"r": {"models": ["smollm2-135m-instruct"],
                                                "context": {"compress": {"model": "gpt-4"}}}}})
    with pytest.raises(ValidationError):
        Config.model_validate({"routes": {"r": {"models": ["smollm2-135m-instruct"],
                                                "context": {"compress": {"target_ratio": 1.0}}}}})

"""Fitting a request into the serving model's context window, so an agent's request stays valid on a small model.

Coding agents (Claude Code, Codex CLI) send many thousands of tokens of system prompt and tool definitions and a
fixed, large max_tokens (Claude Code: 32000), whatever the model. On a model with a 4k or 8k window such a request
is refused outright. Fitting keeps it valid, in this order, stopping as soon as the prompt leaves `min_answer` tokens
of room:

    tools        each tool's description cut to its first sentence and the descriptions inside its parameter
                 schema dropped (names, types and constraints stay, so the grammar and validation are unchanged)
    turns        the oldest conversation turns dropped (compaction's drop_middle, the last turns kept)
    cut          the middle of the longest message left out, with a note that says so, until the prompt fits;
                 never the last user message, which is the question (an agent may send a long system message
                 after it, as Claude Code sends its environment)
    max_tokens   then an asked max_tokens past the window is lowered to the room left (the answer ends with
                 its length reason, as any answer cut by max_tokens)

A prompt that still does not fit is left as it is: the backend refuses it with the numbers (400). What fitting did
is on the ledger row and in x-tokenomy-context, like every context lever (docs/context.md).
"""

from __future__ import annotations

import re
from typing import Any

from tokenomy.context.compaction import Count, compact

CUT_NOTE = "\n[... {n} characters left out to fit the model's context window ...]\n"
MIN_KEPT_CHARS = 400      # a cut message keeps at least this much of its head and tail

SENTENCE = re.compile(r"(.+?[.!?])(?:\s|$)", re.S)
MAX_BRIEF_CHARS = 200
SCHEMA_NOTES = frozenset({"description", "$schema", "examples", "title", "$comment"})


def first_sentence(text: str) -> str:
    """The first sentence of `text`'s first paragraph, at most MAX_BRIEF_CHARS characters."""
    para = text.strip().split("\n\n")[0].strip()
    m = SENTENCE.match(para)
    brief = (m.group(1) if m else para).replace("\n", " ")
    return brief[:MAX_BRIEF_CHARS]


def _bare(schema: Any, under_properties: bool = False) -> Any:
    """A JSON schema without its prose (descriptions, titles, examples); a property *named* "description" stays."""
    if isinstance(schema, dict):
        return {k: _bare(v, k in ("properties", "$defs", "definitions", "patternProperties"))
                for k, v in schema.items() if under_properties or k not in SCHEMA_NOTES}
    if isinstance(schema, list):
        return [_bare(x) for x in schema]
    return schema


def brief_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools with short descriptions and prose-free parameter schemas (other keys, such as
    cache_control, kept)."""
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            out.append(tool)
            continue
        brief = dict(fn)
        if isinstance(fn.get("description"), str):
            brief["description"] = first_sentence(fn["description"])
        if "parameters" in fn:
            brief["parameters"] = _bare(fn["parameters"])
        out.append({**tool, "function": brief})
    return out


class DropMiddle:
    """compaction's settings for dropping the oldest turns down to `trigger_tokens`."""

    strategy = "drop_middle"
    keep_last_turns = 1
    block_turns = 1
    mask_tool_outputs = True
    max_summary_tokens = 0

    def __init__(self, trigger_tokens: int) -> None:
        self.trigger_tokens = trigger_tokens


async def fit_turns(messages: list[dict[str, Any]], limit: int, count: Count) -> tuple[list[dict[str, Any]], int]:
    """`messages` with the oldest turns (and old tool outputs) dropped until they count at most `limit`, keeping the
    system messages and the last turn; (messages, turns dropped)."""
    done = await compact(messages, DropMiddle(limit), count)
    return done.messages, done.turns_replaced


def cut_middle(messages: list[dict[str, Any]], limit: int, count: Count, rounds: int = 12
               ) -> tuple[list[dict[str, Any]], int]:
    """`messages` with the middle of the longest text message (never the last user message) left out, with CUT_NOTE in
    its place, until they count at most `limit` tokens or nothing is left to cut; (messages, characters cut). Each
    round cuts what the overshoot needs at the prompt's own characters per token, with a margin; two thirds of
    what is kept is the head (instructions tend to open a system prompt), one third the tail."""
    msgs = [dict(m) for m in messages]
    removed = 0
    for _ in range(rounds):
        tokens = count(msgs)
        over = tokens - limit
        if over <= 0:
            break
        question = max((j for j, m in enumerate(msgs) if m.get("role") == "user"), default=len(msgs) - 1)
        texts = [j for j, m in enumerate(msgs) if j != question and isinstance(m.get("content"), str)]
        if not texts:
            break
        i = max(texts, key=lambda j: len(msgs[j]["content"]))
        text = msgs[i]["content"]
        chars = sum(len(m["content"]) for m in msgs if isinstance(m.get("content"), str))
        per_token = max(chars / max(tokens, 1), 1.0)
        cut = min(len(text) - MIN_KEPT_CHARS, int(over * per_token * 1.15) + 64)
        if cut <= 0:
            break
        kept = len(text) - cut
        head = kept * 2 // 3
        msgs[i]["content"] = text[:head] + CUT_NOTE.format(n=cut) + text[len(text) - (kept - head):]
        removed += cut
    return msgs, removed

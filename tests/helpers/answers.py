"""How an answer ended, as each API promises it, whatever the model said.

A real model ends an answer on its own (its end-of-turn token, a stop string) or runs into the token limit; which
of the two depends on its words and, where two tokens nearly tie, on the CPU's kernels (tests/helpers/noise.py):
the same greedy request stops at 20 tokens on one machine and runs to 24 on another. A test of a real model checks
that the answer's end and its usage agree, never which end a 135M model happened to reach:

- cut at the limit: exactly the limit's tokens, and the API says so (`length`, `incomplete` with reason
  `max_output_tokens`, `max_tokens`);
- ended by the model: fewer tokens than the limit (`stop`, `completed`, `end_turn`), at most the limit where a
  stop string may match in the last token (sequence_output.py reports a stop string over the length).

A test that needs one end in particular gets it by construction (`ignore_eos`, a grammar, a stop string the text
must contain), not by hoping.
"""

from __future__ import annotations

from typing import Any


def _get(x: Any, name: str) -> Any:
    return x.get(name) if isinstance(x, dict) else getattr(x, name)


def assert_chat_end(finish_reason: str | None, completion_tokens: int, max_tokens: int,
                    stop_strings: bool = False) -> None:
    """Chat and completions: `length` with exactly `max_tokens` tokens, or `stop` with fewer (or as many, when
    the request had `stop_strings`)."""
    seen = (finish_reason, completion_tokens, max_tokens)
    assert finish_reason in ("stop", "length"), seen
    if finish_reason == "length":
        assert completion_tokens == max_tokens, seen
    else:
        assert completion_tokens <= max_tokens if stop_strings else completion_tokens < max_tokens, seen


def assert_response_end(r: Any, max_output_tokens: int) -> None:
    """Responses (an SDK object or its JSON): `completed` with no incomplete_details and fewer output tokens than
    `max_output_tokens`, or `incomplete` for `max_output_tokens` with exactly that many; a message item's status
    is the response's."""
    status, details, used = _get(r, "status"), _get(r, "incomplete_details"), _get(_get(r, "usage"), "output_tokens")
    seen = (status, details, used, max_output_tokens)
    assert status in ("completed", "incomplete"), seen
    if status == "completed":
        assert details is None and used < max_output_tokens, seen
    else:
        assert details is not None and _get(details, "reason") == "max_output_tokens", seen
        assert used == max_output_tokens, seen
    assert _get(r, "error") is None, seen
    for item in _get(r, "output"):
        if _get(item, "type") == "message":
            assert _get(item, "status") == status, (item, status)


def assert_message_end(m: Any, max_tokens: int) -> None:
    """Anthropic Messages (an SDK object or its JSON): `max_tokens` with exactly `max_tokens` output tokens, or
    `end_turn` with fewer; no stop_sequence named for either."""
    reason, used = _get(m, "stop_reason"), _get(_get(m, "usage"), "output_tokens")
    seen = (reason, used, max_tokens)
    assert reason in ("end_turn", "max_tokens"), seen
    assert used == max_tokens if reason == "max_tokens" else used < max_tokens, seen
    assert _get(m, "stop_sequence") is None, seen


def assert_message_stop(m: Any, stop_sequences: list[str], max_tokens: int) -> None:
    """Anthropic Messages asked with `stop_sequences`: the text holds none of them (the first match ends it), and
    either `stop_sequence` names the one that matched (at most `max_tokens` output tokens: it may match in the last
    one) or the answer ended as assert_message_end says."""
    text = "".join(_get(b, "text") for b in _get(m, "content") if _get(b, "type") == "text")
    assert not [s for s in stop_sequences if s in text], (text, stop_sequences)
    if _get(m, "stop_reason") == "stop_sequence":
        seen = (_get(m, "stop_sequence"), _get(_get(m, "usage"), "output_tokens"), stop_sequences, max_tokens)
        assert seen[0] in stop_sequences and seen[1] <= max_tokens, seen
    else:
        assert_message_end(m, max_tokens)

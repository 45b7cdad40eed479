"""OpenAI's Responses compaction (`POST /v1/responses/compact`): a conversation (its `input`, or the stored one
`previous_response_id` names) becomes a shorter item list that a later request's `input` takes in its place.

The compacted list is what OpenAI's reference gives: every user message, verbatim, then one `compaction` item.
tokenomy's item holds, in `encrypted_content`, a summary written by the request's model with the context stage's
own compaction (tokenomy/context/compaction.py: its prompt, its rendering of the turns, its summary header) as
plain text, not encrypted: it is the caller's own conversation, and the gateway that reads it back is this one.
A later `input` turns a compaction item back into that summary, a system message (dialect/responses.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tokenomy.context.compaction import SUMMARY_PROMPT, render
from tokenomy.dialect.responses import ResponsesRequest
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest

SUMMARY_TOKENS = 256    # a compaction's summary is at most this long


class CompactRequest(ResponsesRequest):
    """The compact body: model, input or previous_response_id, instructions (the other create fields are
    accepted and ignored, as the reference accepts the few it lists)."""

    input: str | list[dict[str, Any]] = Field(default_factory=list)
    max_output_tokens: int | None = Field(SUMMARY_TOKENS, ge=1)

    def summary_request(self, history: list[dict[str, Any]] | None = None) -> tuple[GenRequest, list[dict[str, Any]]]:
        """(the request that writes the summary, the conversation it summarizes as internal messages)."""
        conversation = list(history or []) + self.input_messages()
        if not conversation:
            raise APIError(400, "input (or previous_response_id) must hold at least one message to compact",
                           param="input", code="invalid_value")
        text = render([conversation])
        system = SUMMARY_PROMPT if not self.instructions else f"{self.instructions}\n\n{SUMMARY_PROMPT}"
        gen = GenRequest(model=self.model, kind="chat", api="responses",
                         messages=[{"role": "system", "content": system}, {"role": "user", "content": text}],
                         params={"max_tokens": self.max_output_tokens or SUMMARY_TOKENS, "temperature": 0},
                         user=self.user or self.prompt_cache_key)
        return gen, conversation


def compacted_output(conversation: list[dict[str, Any]], summary: str, new_id: Any) -> list[dict[str, Any]]:
    """The compacted item list: each user message of `conversation` as an input message item, then the
    compaction item holding `summary`."""
    users = [{"type": "message", "id": new_id("msg_"), "role": "user", "status": "completed",
              "content": [{"type": "input_text", "text": str(m.get("content") or ""), "prompt_cache_breakpoint": None}]}
             for m in conversation if m.get("role") == "user"]
    return users + [{"type": "compaction", "id": new_id("cmp_"), "encrypted_content": summary,
                     "created_by": None}]

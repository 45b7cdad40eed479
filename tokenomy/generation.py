"""One generation as every layer sees it: the internal request each dialect maps to (`GenRequest`, with
`TokenRouting` for token-level routing), the pieces of its answer (`Delta`) and what it used (`Usage`), and the
reading of its chat messages (OpenAI ``messages`` lists: their shape checks and the text of a turn, which the
response caches and routing read). The pipeline hands it to backends, the meter prices it; it imports nothing of
tokenomy, so every layer can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The work one request may ask for, in every dialect (docs/api.md, "Limits"): a 400 naming the limit above them.
MAX_MESSAGES = 2048           # messages (chat, Messages) or input items (Responses), as OpenAI's chat limit
MAX_OUTPUT_TOKENS = 1 << 20   # max_tokens and its kin; the context stage then lowers it to the model's window


@dataclass(frozen=True)
class TokenRouting:
    """What token-level routing (router/token_routing.py) asks of an embedded backend for one part of an answer;
    only embedded backends take it (engine/sampling_params.py carries the last three into the engine)."""

    prompt_ids: list[int] | None = None     # the prompt's exact tokens: no template is rendered
    signal: str | None = None               # report each token's confidence under this signal (Delta.signals)
    handover_below: float | None = None     # end with finish_reason "handover" where the signal falls below this,
    handover_after: int = 0                 # ... but not before this many output tokens


@dataclass
class GenRequest:
    """One generation, already validated. `messages` for chat, `prompt` for completions; `inputs` for an embeddings
    request (kind "embedding"), which the gateway serves with the admit and record stages around an embed stage."""

    model: str
    kind: str = "chat"                                  # chat | completion | embedding
    # the API the client called, which the ledger's `api` column and the metrics' `endpoint` label say:
    # chat.completions | completions | messages | responses | embeddings (the generating dialects map to kind chat or
    # completion, embeddings to kind embedding)
    api: str = "chat.completions"
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    # embedding: the texts, or the token-id lists, to embed, in order (params: encoding_format, dimensions)
    inputs: list[str] | list[list[int]] | None = None
    # OpenAI sampling fields, normalised; also `n` and `best_of` when they ask for more than one choice, and
    # `prediction` ({"type": "content", "content": text}) when the client predicted the answer
    params: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    request_id: str = ""
    priority: str = "interactive"   # batch: served only in capacity interactive requests leave (docs/batch.md)
    user: str | None = None                             # the client's `user` field (session affinity)
    headers: dict[str, str] = field(default_factory=dict, repr=False)   # the client's, lower-cased (a pool's
    #                                                     session-affinity header)
    stream: bool = True     # False: the caller only wants the whole answer, which a backend may deliver in one piece
    token_routing: TokenRouting | None = field(default=None, repr=False)   # set by token-level routing only
    # keep the conversation's KV (prompt and answer) pinned in an embedded engine this long after the answer, for
    # its next turn (the Responses WebSocket sets it; SamplingParams.pin_s); other backends ignore it
    pin_s: float = 0.0
    # A backend's count_tokens leaves its work here: (backend name, kind, messages, tools, prompt, token ids).
    # Generating on the same backend from the very same inputs (identical objects, as dataclasses.replace keeps
    # them) reuses the ids instead of rendering the template and tokenizing a second time; any new messages,
    # tools or prompt object invalidates it.
    counted: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    # the span a backend hangs its spans under (an upstream call's, the engine's: telemetry/trace.py); None: not traced
    trace: Any = field(default=None, repr=False, compare=False)


@dataclass
class Delta:
    """A piece of a streamed answer. The last one carries finish_reason and usage. An answer of several choices
    (`n` > 1) says each piece's choice (`index`); each choice's last piece carries its finish_reason, and the stream's
    last delta (one of those) the usage of them all."""

    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None      # OpenAI delta tool_calls, passed through
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    error_code: str | None = None       # with error: its code for the client (default: the dialect's upstream error)
    stop_sequence: str | None = None    # on the last delta: the client's stop string that ended the answer, if known
    confidence: list[float] = field(default_factory=list)   # chosen-token logprobs, when the backend knows them
    token_ids: list[int] = field(default_factory=list)      # the tokens of `text`, from an embedded backend
    signals: list[float] = field(default_factory=list)      # each token's confidence, when TokenRouting.signal asked
    index: int = 0                                          # the choice this piece belongs to (n > 1)

    @property
    def last(self) -> bool:
        """Whether this delta ends the stream: it carries the usage (every choice has finished) or an error."""
        return self.usage is not None or self.error is not None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0          # with several choices (n, best_of), over every one generated
    cached_tokens: int = 0       # prompt tokens read from a prompt (prefix) cache; part of prompt_tokens
    cache_write_tokens: int = 0  # prompt tokens written to an upstream's prompt cache (Anthropic's
    #                              cache_creation_input_tokens); part of prompt_tokens, apart from cached_tokens
    counted: bool = False        # True when we counted because the upstream sent no usage
    queue_s: float = 0.0
    load_s: float = 0.0          # seconds the request waited for its model to load (backends/fleet.py), before queue_s
    ttft_s: float | None = None
    e2e_s: float = 0.0
    mean_logprob: float | None = None
    min_logprob: float | None = None
    replica: str | None = None   # which replica of a pooled model served (backends/pool.py); None: not pooled
    draft_tokens: int | None = None     # speculative draft tokens the engine fed for this answer (None: unknown)
    draft_accepted: int | None = None   # ... and how many of them it accepted
    # Predicted Outputs: the prediction's tokens drafted and accepted, and drafted and rejected (None: no prediction)
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    handovers: int | None = None        # token-level routing: times the large model took over (None: not routed)
    # an answer several models wrote (token-level routing): each model's own usage, in the order first used;
    # the fields above are their sums, and each part is priced at its own model's price
    parts: list[tuple[str, Usage]] = field(default_factory=list)


def message_dicts(messages: Any) -> list[Mapping[str, Any]]:
    """``messages`` as a list of mappings (pydantic models dumped without None fields); raises TypeError when
    it is not a list of message objects."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise TypeError("messages must be a list of message objects")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) and not hasattr(m, "model_dump"):
            raise TypeError(f"messages[{i}] is not an object")
    return [m if isinstance(m, Mapping) else m.model_dump(exclude_none=True) for m in messages]


def message_text(message: Mapping[str, Any]) -> str | None:
    """The text of a message: a string content, or the text parts of a content list joined by newlines.

    Returns None when the content holds anything but text (images, audio): such a turn cannot be embedded.
    """
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and content:
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def last_user_text(messages: Sequence[Mapping[str, Any]], *, final: bool = True) -> str | None:
    """The text of the last user message (see ``message_text``), or None when there is none.

    ``final=True`` (the semantic cache): only when the conversation ends with that message and its text is not
    blank. A conversation that ends with a tool result or an assistant prefill is not a question the cache can
    answer, so it gets None and is served uncached. ``final=False`` (routing rules): the last user message
    wherever it is. The caller picks its own fallback for None.
    """
    msgs = message_dicts(messages)
    if final:
        if not msgs or msgs[-1].get("role") != "user":
            return None
        text = message_text(msgs[-1])
        return text if text and text.strip() else None
    for m in reversed(msgs):
        if m.get("role") == "user":
            return message_text(m)
    return None

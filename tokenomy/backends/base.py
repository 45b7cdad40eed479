"""The backend protocol: what the pipeline's generate stage needs from any model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tokenomy.context.tokens import TokenCount


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
    """One generation, already validated. `messages` for chat, `prompt` for completions."""

    model: str
    kind: str = "chat"                                  # chat | completion
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    params: dict[str, Any] = field(default_factory=dict)   # OpenAI sampling fields, normalised
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
    # A backend's count_tokens leaves its work here: (backend name, kind, messages, tools, prompt, token ids).
    # Generating on the same backend from the very same inputs (identical objects, as dataclasses.replace keeps
    # them) reuses the ids instead of rendering the template and tokenizing a second time; any new messages,
    # tools or prompt object invalidates it.
    counted: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)


@dataclass
class Delta:
    """A piece of a streamed answer. The last one carries finish_reason and usage."""

    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None      # OpenAI delta tool_calls, passed through
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    confidence: list[float] = field(default_factory=list)   # chosen-token logprobs, when the backend knows them
    token_ids: list[int] = field(default_factory=list)      # the tokens of `text`, from an embedded backend
    signals: list[float] = field(default_factory=list)      # each token's confidence, when TokenRouting.signal asked


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    counted: bool = False        # True when we counted because the upstream sent no usage
    queue_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    mean_logprob: float | None = None
    min_logprob: float | None = None
    replica: str | None = None   # which replica of a pooled model served (backends/pool.py); None: not pooled
    draft_tokens: int | None = None     # speculative draft tokens the engine fed for this answer (None: unknown)
    draft_accepted: int | None = None   # ... and how many of them it accepted
    handovers: int | None = None        # token-level routing: times the large model took over (None: not routed)
    # an answer several models wrote (token-level routing): each model's own usage, in the order first used;
    # the fields above are their sums, and each part is priced at its own model's price
    parts: list[tuple[str, Usage]] = field(default_factory=list)


class BackendError(Exception):
    """A backend could not serve. `retryable`: another deployment may succeed (5xx, timeouts, 429)."""

    def __init__(self, message: str, status: int = 502, retryable: bool = True,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


class InvalidRequest(ValueError):
    """Bad input detected by the backend (e.g. the prompt is longer than the context window)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class Overloaded(RuntimeError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Backend(Protocol):
    """What the pipeline needs of a model: the embedded engine (embedded.py) or an upstream (openai.py)."""

    name: str

    def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The answer as deltas; the last has finish_reason and usage. Raises InvalidRequest (a 4xx),
        Overloaded (429) or BackendError before the first delta; a failure after it is an error delta."""
        ...

    def count_tokens(self, req: GenRequest) -> TokenCount:
        """The request's prompt tokens, exact or flagged as an estimate."""
        ...

    async def health(self) -> bool: ...

    def expected_wait_s(self) -> float:
        """The queue wait a new request should expect now (seconds)."""
        ...

    async def close(self) -> None: ...

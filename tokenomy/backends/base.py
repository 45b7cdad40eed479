"""The backend protocol: what the pipeline's generate stage needs from any model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tokenomy.context.tokens import TokenCount
from tokenomy.generation import Delta, GenRequest, Usage


class BackendError(Exception):
    """A backend could not serve. `retryable`: another deployment may succeed (5xx, timeouts, 429, a
    misconfigured deployment). `status`: what this failure alone would be to a client (502 a bad answer or none,
    503 busy, 504 past the deadline). `retry_after`: seconds the upstream said to wait, where it said. `lasting`:
    the deployment itself is wrong (its key, model or URL), so waiting will not mend it."""

    def __init__(self, message: str, status: int = 502, retryable: bool = True,
                 retry_after: float | None = None, lasting: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.lasting = lasting


class InvalidRequest(ValueError):
    """Bad input detected by the backend (e.g. the prompt is longer than the context window), or refused by its
    upstream; `status` is the client's error status: 400, or an upstream's 413 or 422."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


class Overloaded(RuntimeError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Backend(Protocol):
    """What the pipeline needs of a model: the embedded engine (embedded.py) or an upstream (openai.py)."""

    name: str

    def stream(self, req: GenRequest) -> AsyncIterator[Delta]:
        """The answer as deltas; the last has finish_reason and usage. Raises InvalidRequest (a 4xx),
        Overloaded (429: the engine's own queue) or BackendError before the first delta; a failure after it is an
        error delta."""
        ...

    def count_tokens(self, req: GenRequest) -> TokenCount:
        """The request's prompt tokens, exact or flagged as an estimate."""
        ...

    async def health(self) -> bool: ...

    def expected_wait_s(self) -> float:
        """The queue wait a new request should expect now (seconds)."""
        ...

    def queued(self) -> float | None:
        """Requests waiting for this backend now, where it knows (the batch worker holds back above a limit); None
        where it does not."""
        ...

    async def close(self) -> None: ...


@dataclass
class Embeddings:
    """An embeddings request's answer: one float32 row per input, in the inputs' order, and the tokens read."""

    vectors: np.ndarray             # (inputs, dimensions), float32
    usage: Usage                    # prompt_tokens; queue_s and e2e_s where known


class EmbeddingBackend(Protocol):
    """What the embed stage needs of an embedding model: the packaged MiniLM (minilm.py) or an OpenAI-compatible
    upstream (openai.py, pool.py)."""

    name: str

    async def embed(self, req: GenRequest) -> Embeddings:
        """Embed `req.inputs` in one call. Raises InvalidRequest (a 400: inputs or `dimensions` the model cannot
        take), Overloaded (429) or BackendError."""
        ...

    async def close(self) -> None: ...

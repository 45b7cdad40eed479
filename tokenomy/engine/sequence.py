"""One request's state inside the engine: its tokens, how many of them have KV, its slot and its output."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

from tokenomy.engine import tuning
from tokenomy.engine.sampling_params import SamplingParams
from tokenomy.engine.sequence_output import SequenceOutput, TokenLogprob

if TYPE_CHECKING:
    from tokenomy.engine.spec.prediction import Prediction


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class TokenEvent:
    """What the engine reports after each step for one sequence."""

    text: str                               # newly released text (stop strings held back until resolved)
    token_ids: list[int]
    logprobs: list[TokenLogprob]            # one per token when the request asked for logprobs
    finish_reason: str | None = None        # stop | length | handover | cancelled | error
    error: str | None = None
    token_logprobs: list[float] = field(default_factory=list)   # always: the chosen tokens' logprobs
    signals: list[float] = field(default_factory=list)   # each token's confidence, when params.signal asked
    error_code: str | None = None           # with finish_reason "error": queue_full | invalid_request | ...
    error_param: str | None = None
    stop_sequence: str | None = None        # on the final event: the stop string that ended the answer, if one did
    # on the final event only: counts, and times on the monotonic perf_counter clock (shared by processes)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0                   # speculative draft tokens fed, and accepted
    draft_accepted: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    mean_logprob: float | None = None
    min_logprob: float | None = None


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt: list[int]
    params: SamplingParams
    on_event: Callable[[TokenEvent], None]
    constraint: Any = None                  # structured.Constraint, optional
    request_id: str | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    output: list[int] = field(default_factory=list)
    slot: int | None = None                 # llama.cpp seq_id holding this sequence's KV
    n_kv: int = 0                           # kv_tokens()[:n_kv] have KV in the slot, at positions 0..n_kv-1
    dropped: int = 0                        # tokens shifted out of the KV after the first `sink` (context shift)
    sink: int = 0
    cached_tokens: int = 0                  # prompt tokens reused from the prefix cache (first admission)
    reused: bool = False                    # its prompt was seen before (scheduler: retired as protected)
    preemptions: int = 0
    served: int = 0                         # the scheduler step that last fed it (batch sequences take turns)
    cancelled: bool = False
    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    out: SequenceOutput | None = None      # sampling, text and stop strings; the engine sets it at submit
    spec_acceptance: float = tuning.PRIOR_ACCEPTANCE  # share of its drafted tokens accepted lately (speculate.py)
    spec_drafted: int = 0
    spec_accepted: int = 0
    prediction: Prediction | None = field(default=None, repr=False)   # drafts from the client's predicted output
    # n > 1: the request's first sequence computes the prompt's KV, the others are forked from it (Scheduler.fork)
    fork_of: Sequence | None = field(default=None, repr=False)
    forks: list[Sequence] = field(default_factory=list, repr=False)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_kv_tokens(self) -> int:
        """Tokens the KV holds or will: all of them, less those a context shift dropped."""
        return self.num_tokens - self.dropped

    def kv_tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        """The tokens at KV positions start..end-1: the first `sink` tokens, then those after the dropped ones."""
        if not self.dropped:
            return self.tokens[start:end]
        toks = self.tokens
        return (toks[:self.sink] + toks[self.sink + self.dropped:])[start:end]

    @property
    def pending(self) -> int:
        """Tokens not yet in KV: the rest of the prompt, or the last sampled token."""
        return self.num_kv_tokens - self.n_kv

    @property
    def batch(self) -> bool:
        return self.params.priority == "batch"

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

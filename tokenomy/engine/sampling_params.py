"""Per-request sampling settings, validated once at the edge of the engine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from tokenomy.engine import tuning

SIGNALS = ("top1", "margin", "entropy")     # confidence signals a step can report (sampler.confidence)


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0     # 1.0 = off; HF/llama.cpp semantics over prompt and output
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    speculative: bool = True            # false: never draft for this request (the engine's setting still applies)
    # batch: scheduled only into capacity interactive sequences leave, and preempted before them
    priority: Literal["interactive", "batch"] = "interactive"
    # token-level routing (router/token_routing.py): report each step's confidence under `signal`; with
    # `handover_below`, end the sequence with finish_reason "handover" (the unsure token not sampled) when it falls
    # below
    signal: str | None = None
    handover_below: float | None = None
    handover_after: int = 0             # no handover before this many output tokens
    # the client's predicted output (OpenAI's Predicted Outputs), tokenized: the sequence drafts from it
    # (spec/prediction.py) instead of from its own tokens
    prediction: list[int] | None = None
    # keep this sequence's KV (prompt and answer) as a cached prefix pinned for pin_s seconds after it ends: evicted
    # only after every unpinned one, so a pin never refuses live work (a conversation's next turn finds it)
    pin_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError("temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError("presence_penalty and frequency_penalty must be between -2 and 2")
        if not 0.01 <= self.repetition_penalty <= 100.0:   # beyond these, float32 logits overflow to inf
            raise ValueError("repetition_penalty must be between 0.01 and 100")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs must be between 0 and 20")
        if self.priority not in ("interactive", "batch"):
            raise ValueError("priority must be interactive or batch")
        if self.signal is not None and self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}")
        if self.handover_below is not None and self.signal is None:
            raise ValueError("handover_below needs a signal")
        if not 0.0 <= self.pin_s <= tuning.PIN_MAX_S:
            raise ValueError(f"pin_s must be between 0 and {tuning.PIN_MAX_S:g}")
        if len(self.stop) > 4:
            raise ValueError("at most 4 stop sequences are allowed")

    def for_choice(self, i: int) -> SamplingParams:
        """The settings of a request's choice `i` (n > 1): these, with the seed moved on by i as vLLM derives its
        parallel samples' seeds, so seeded choices differ from each other and choice 0 is the answer n = 1 gives."""
        return self if i == 0 or self.seed is None else dataclasses.replace(self, seed=self.seed + i)

    @property
    def may_speculate(self) -> bool:
        """Drafts keep the output distribution but change how a seeded generator is drawn from, so a seeded
        sampled request is never speculated (the same seed gives the same answer). A sequence that may hand
        over is judged on every step's own row, so it is never speculated either."""
        return self.speculative and (self.greedy or self.seed is None) and self.handover_below is None

    @property
    def greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW sample the top token: dividing logits by 1e-45 gives inf, not a
        sharper distribution."""
        return self.temperature < tuning.GREEDY_BELOW

"""The cascade's confidence floors, chosen from the first model's answers to your own prompts.

The cascade escalates an answer when its mean token log-probability is below `min_mean_logprob`, or any token's is
below `min_token_logprob`, or another signal fails (empty, refusal, truncated, invalid JSON: see cascade.judge).
Calibration runs the route's first (cheapest) model on prompts like the route's traffic, reads those signals, and
places the floors so that escalations hit a target.

Floors. Each calibrated signal's floor sits at the same within-sample quantile: at level k the k answers with the
lowest mean logprob fail the mean floor and the k with the lowest minimum logprob fail the token floor (a floor is
the midpoint between the k-th and (k+1)-th sorted values). The escalated set E(k) is the union of those with the
answers the other signals escalate anyway ("forced"); it grows with k. A signal left out of `signals` keeps the
route's configured floor, and its escalations count as forced.

Targets.
- Escalation share s: the k whose share |E(k)| / n is closest to s (the lower on a tie).
- Break-even: with c_i the cheap model's cost of answer i and b_i the capable model's cost of the same prompt,
      cascade(E)       = sum_i c_i + sum_{i in E} b_i      (an escalated request pays both answers)
      always_capable   = sum_i b_i
  the largest k with cascade(E(k)) <= (1 - m) * always_capable - epsilon, m the required saving (0 for plain
  break-even). With mean costs C and B and escalated prompts of average cost this is the share
      e < 1 - m - C / B,
  so with prices r times the cheap model's and answers of equal length, break-even is e* = 1 - 1/r (50% at r = 2).
  b_i is estimated by pricing the cheap answer's token counts at the capable model's prices: it assumes the
  capable model writes answers as long as the cheap one's (measure both when that is far off).

Streams are judged on their first `stream_buffer_tokens` tokens (pipeline/route.py), so calibrate with
`stream=True` for streamed traffic: the signals are then computed on that prefix, as the route stage does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenomy.config import CascadeSettings, Price
from tokenomy.router.cascade import judge

SIGNALS = ("mean", "min")
_FLOOR_FIELD = {"mean": "min_mean_logprob", "min": "min_token_logprob"}


class FloorError(ValueError):
    """Bad prompts or an unreachable target."""


@dataclass
class FirstAnswer:
    """The first model's answer to one calibration prompt and what it costs."""

    prompt: str
    text: str
    logprobs: list[float]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    complete: bool = True          # False: judged on a stream's first tokens only

    @property
    def mean(self) -> float:
        return float(np.mean(self.logprobs)) if self.logprobs else 0.0

    @property
    def low(self) -> float:
        return float(min(self.logprobs)) if self.logprobs else 0.0


@dataclass
class FloorChoice:
    settings: CascadeSettings              # the route's settings with the chosen floors
    escalated: int                         # on the calibration prompts, judged with `settings`
    forced: int                            # of which escalated by signals other than the calibrated floors
    prompts: int
    cheap_usd: float                       # sum of c_i
    capable_usd: float                     # sum of b_i (estimated)
    cascade_usd: float                     # sum of c_i + sum over escalated of b_i
    target: dict[str, Any]
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def escalation_share(self) -> float:
        return self.escalated / self.prompts

    @property
    def cost_ratio(self) -> float:
        """Cascade cost / always-capable cost (below 1: the cascade saves)."""
        return self.cascade_usd / self.capable_usd if self.capable_usd else float("inf")

    def snippet(self, route: str) -> str:
        """The YAML for the route's `cascade:` block: the two floors, with the figures as comments."""
        s = self.settings
        return (f"# tokenomy router calibrate --cascade: {self.escalated}/{self.prompts} calibration answers escalate "
                f"({self.escalation_share:.1%}); estimated cost {self.cost_ratio:.1%} of always-capable\n"
                f"routes:\n  {route}:\n    cascade:\n"
                f"      min_mean_logprob: {s.min_mean_logprob}\n      min_token_logprob: {s.min_token_logprob}\n")

    def to_dict(self) -> dict[str, Any]:
        return {"floors": {"min_mean_logprob": self.settings.min_mean_logprob,
                           "min_token_logprob": self.settings.min_token_logprob},
                "escalated": self.escalated, "forced": self.forced, "prompts": self.prompts,
                "escalation_share": self.escalation_share, "cheap_usd": self.cheap_usd,
                "capable_usd": self.capable_usd, "cascade_usd": self.cascade_usd, "cost_ratio": self.cost_ratio,
                "target": self.target, "reasons": self.reasons}


# ---- prompts and answers --------------------------------------------------------------------------------------
def load_prompts(path: Path) -> list[dict[str, Any]]:
    """JSONL, one request a line: a JSON string, {"prompt": ...} or {"messages": [...]}, optionally with
    "max_tokens". Returns [{"messages": [...], "max_tokens": int | None}]."""
    out = []
    for no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise FloorError(f"{path}:{no}: not JSON ({e.msg})") from None
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict):
            raise FloorError(f"{path}:{no}: expected a string or an object with prompt or messages")
        if isinstance(row.get("messages"), list) and row["messages"]:
            messages = row["messages"]
        elif isinstance(row.get("prompt"), str) and row["prompt"].strip():
            messages = [{"role": "user", "content": row["prompt"]}]
        else:
            raise FloorError(f"{path}:{no}: needs a non-empty prompt (string) or messages (list)")
        max_tokens = row.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise FloorError(f"{path}:{no}: max_tokens must be a positive integer, got {max_tokens!r}")
        out.append({"messages": messages, "max_tokens": max_tokens})
    if not out:
        raise FloorError(f"{path}: no prompts")
    return out


async def sample_answers(backend: Any, requests: Sequence[dict[str, Any]], max_tokens: int,
                         stream_buffer: int | None = None, concurrency: int = 4) -> list[FirstAnswer]:
    """Greedy answers of `backend` (a Backend: embedded or openai) to each request, with their token logprobs.

    stream_buffer: judge only the first N tokens, as the route stage does for streamed answers."""
    from tokenomy.generation import GenRequest

    gate = asyncio.Semaphore(max(1, concurrency))
    upstream = getattr(backend, "engine", None) is None     # an upstream only sends logprobs when asked

    async def one(i: int, r: dict[str, Any]) -> FirstAnswer:
        params: dict[str, Any] = {"max_tokens": r.get("max_tokens") or max_tokens, "temperature": 0}
        if upstream:
            params["logprobs"] = True
        req = GenRequest(model=backend.name, messages=r["messages"], params=params, request_id=f"calibrate-{i}")
        text, conf, finish, usage = "", [], None, None
        async with gate:
            async for d in backend.stream(req):
                text += d.text
                conf += d.confidence
                finish = d.finish_reason or finish
                usage = d.usage or usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        completion = usage.completion_tokens if usage else len(conf)
        complete = True
        if stream_buffer is not None and len(conf) > stream_buffer:
            conf, complete = conf[:stream_buffer], False
        prompt = str(r["messages"][-1].get("content") or "")
        return FirstAnswer(prompt, text, conf, finish, prompt_tokens, completion, complete)

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))


def answers_from_json(rows: Sequence[dict[str, Any]]) -> list[FirstAnswer]:
    return [FirstAnswer(**r) for r in rows]


def answers_to_json(answers: Sequence[FirstAnswer]) -> list[dict[str, Any]]:
    return [asdict(a) for a in answers]


# ---- choosing the floors --------------------------------------------------------------------------------------
def _usd(price: Price, a: FirstAnswer) -> float:
    from tokenomy.ledger.pricing import cost

    return cost(price, a.prompt_tokens, 0, a.completion_tokens).total_usd


def _floor_at(values: np.ndarray, k: int) -> float:
    """A floor below which exactly the k smallest values fall (values < floor), rounded to 4 decimals outward."""
    v = np.sort(values)
    if k <= 0:
        return float(np.floor((v[0] - 0.01) * 1e4) / 1e4) if len(v) else -100.0
    if k >= len(v):
        return float(np.ceil((v[-1] + 1e-4) * 1e4) / 1e4)
    mid = (v[k - 1] + v[k]) / 2
    return float(round(mid, 4))


def _settings_at(answers: Sequence[FirstAnswer], base: CascadeSettings, signals: Sequence[str], k: int
                 ) -> CascadeSettings:
    floors = {}
    for s in signals:
        values = np.array([a.mean if s == "mean" else a.low for a in answers if a.logprobs])
        if len(values):
            floors[_FLOOR_FIELD[s]] = _floor_at(values, k)
    return base.model_copy(update=floors)


def _judge_all(answers: Sequence[FirstAnswer], settings: CascadeSettings) -> tuple[np.ndarray, dict[str, int]]:
    """Which answers escalate under `settings` (via cascade.judge itself), and a count per kind of reason."""
    esc, reasons = [], {}
    for a in answers:
        v = judge(a.text, a.logprobs, a.finish_reason, None, settings, complete=a.complete)
        esc.append(v.escalate)
        for r in v.reasons:
            kind = r.split(" ")[0] if r.startswith(("mean", "min")) else r
            kind = {"mean": "mean logprob", "min": "min token logprob"}.get(kind, kind)
            reasons[kind] = reasons.get(kind, 0) + 1
    return np.array(esc, dtype=bool), reasons


def choose_floors(answers: Sequence[FirstAnswer], base: CascadeSettings, cheap: Price, capable: Price,
                  escalation_share: float | None = None, min_saving: float | None = None,
                  signals: Sequence[str] = SIGNALS) -> FloorChoice:
    """Floors hitting `escalation_share`, or the largest share saving at least `min_saving` (0: break-even).

    Exactly one target must be given. See the module docstring for the search and the cost formula."""
    if (escalation_share is None) == (min_saving is None):
        raise FloorError("give exactly one target: an escalation share or break-even (a minimum saving)")
    if not answers:
        raise FloorError("no answers to calibrate on")
    bad = [s for s in signals if s not in SIGNALS]
    if bad or not signals:
        raise FloorError(f"signals must be among {', '.join(SIGNALS)}, got {list(signals)}")
    if escalation_share is not None and not 0.0 <= escalation_share <= 1.0:
        raise FloorError(f"escalation share must be between 0 and 1, got {escalation_share}")
    if min_saving is not None and not 0.0 <= min_saving < 1.0:
        raise FloorError(f"minimum saving must be in [0, 1), got {min_saving}")
    n = len(answers)
    c = np.array([_usd(cheap, a) for a in answers])
    b = np.array([_usd(capable, a) for a in answers])
    # The calibrated floors off (-inf): what escalates anyway.
    off = base.model_copy(update={_FLOOR_FIELD[s]: -1e9 for s in signals})
    forced, _ = _judge_all(answers, off)
    levels = [_settings_at(answers, base, signals, k) for k in range(n + 1)]
    judged = [_judge_all(answers, s) for s in levels]
    shares = np.array([e.mean() for e, _ in judged])
    cascade = np.array([c.sum() + b[e].sum() for e, _ in judged])
    if escalation_share is not None:
        if forced.mean() > escalation_share + 1e-12:
            raise FloorError(_forced_message(answers, off, forced, f"the target share {escalation_share:.0%}"))
        k = int(np.argmin(np.abs(shares - escalation_share) + 1e-9 * np.arange(n + 1)))
        target: dict[str, Any] = {"escalation_share": escalation_share}
    else:
        if b.sum() <= 0:
            raise FloorError("the capable model has no price (0 USD): nothing to break even against; set its "
                             "`price:` in the config")
        budget = (1.0 - min_saving) * b.sum()
        ok = np.flatnonzero(cascade < budget * (1 - 1e-9))
        target = {"min_saving": min_saving, "break_even_share": float(1.0 - min_saving - c.sum() / b.sum())}
        if len(ok) == 0:
            raise FloorError(
                f"the cascade cannot save {min_saving:.0%} on these prompts: the cheap answers alone cost "
                f"{c.sum() / b.sum():.1%} of always-capable and {int(forced.sum())}/{n} escalate anyway"
                + (f" ({_forced_kinds(answers, off, forced)})" if forced.any() else ""))
        k = int(ok[np.argmax(shares[ok] + 1e-9 * ok)])
    esc, reasons = judged[k]
    return FloorChoice(levels[k], int(esc.sum()), int(forced.sum()), n, float(c.sum()), float(b.sum()),
                       float(cascade[k]), target, reasons)


def _forced_kinds(answers: Sequence[FirstAnswer], off: CascadeSettings, forced: np.ndarray) -> str:
    _, reasons = _judge_all([a for a, f in zip(answers, forced, strict=True) if f], off)
    return ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))


def _forced_message(answers: Sequence[FirstAnswer], off: CascadeSettings, forced: np.ndarray, what: str) -> str:
    hint = ""
    if any(a.finish_reason == "length" for a, f in zip(answers, forced, strict=True) if f):
        hint = ("; truncated answers: raise --max-tokens to what your requests ask for, or set "
                "escalate_on_truncated: false")
    return (f"{int(forced.sum())}/{len(answers)} answers ({forced.mean():.1%}) escalate on signals other than the "
            f"floors ({_forced_kinds(answers, off, forced)}), already above {what}{hint}")

"""A known set of finished requests for the meter tests: real RequestContext objects as the pipeline leaves them
(no model is involved in metering, so the usage is written down rather than generated)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tokenomy.config import Price
from tokenomy.errors import APIError
from tokenomy.generation import GenRequest, Usage
from tokenomy.hardware.energy import Energy
from tokenomy.ledger.row import LedgerRow, row_from_context
from tokenomy.pipeline.request import RequestContext

PRICES = {
    "small": Price(input=0.02, cached_input=0.005, output=0.08, notional=True),
    "large": Price(input=0.20, cached_input=0.05, output=0.60),
}
BACKENDS = {"small": "embedded", "large": "openai"}


@dataclass
class Spec:
    """One request as the client saw it: the usage it received, its outcome, and what the meter measured."""

    model: str | None
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    cache: str = "miss"
    tenant: str = "acme"
    key_id: str | None = "k1"
    route: str | None = None
    status: int = 200
    error_code: str | None = None
    finish: str | None = "stop"
    ttft: float | None = 0.1
    gen_s: float = 0.5
    queue: float = 0.01
    e2e: float = 0.6
    energy: Energy | None = None
    over_budget: bool = False
    savings: dict[str, Any] = field(default_factory=dict)
    ago_s: float = 600.0


def context(spec: Spec, rid: str, now: float) -> RequestContext:
    ctx = RequestContext(gen=GenRequest(model=spec.route or spec.model or "small"), request_id=rid)
    ctx.started = time.perf_counter() - spec.e2e
    ctx.tenant, ctx.key_id, ctx.route, ctx.model, ctx.cache = (spec.tenant, spec.key_id, spec.route,
                                                                spec.model, spec.cache)
    ctx.over_budget = spec.over_budget
    if spec.status >= 400:
        ctx.error, ctx.status = APIError(spec.status, f"failed {rid}", code=spec.error_code), spec.status
    if spec.prompt or spec.completion:
        ctx.usage = Usage(prompt_tokens=spec.prompt, cached_tokens=spec.cached, completion_tokens=spec.completion,
                          queue_s=spec.queue, ttft_s=spec.ttft, e2e_s=spec.gen_s)
    ctx.finish_reason = spec.finish
    return ctx


def rows_for(specs: list[Spec], now: float | None = None, prefix: str = "req") -> list[LedgerRow]:
    """Ledger rows for the specs, arriving spec.ago_s before `now`."""
    now = time.time() if now is None else now
    out = []
    for i, s in enumerate(specs):
        ctx = context(s, f"{prefix}_{i:04d}", now)
        price = PRICES.get(s.model or "")
        out.append(row_from_context(ctx, price, s.energy, BACKENDS.get(s.model or ""), now=now - s.ago_s + s.e2e,
                                    savings=s.savings))
    return out


def mixed() -> list[Spec]:
    """Two models with different prices, prefix-cached prompts, exact and semantic hits, errors before and after
    routing, a cancelled stream, a budget refusal, an over-context-budget prompt, measured and estimated energy."""
    return [
        Spec("small", 120, 0, 40, route="default", energy=Energy(3.0, "estimate"), ago_s=900, ttft=0.08),
        Spec("small", 300, 256, 60, route="default", energy=Energy(2.5, "estimate"), ago_s=880, ttft=0.05,
             gen_s=0.9),
        Spec("small", 300, 0, 60, cache="exact", key_id="k2", ago_s=860, ttft=None),
        Spec("large", 1000, 512, 200, tenant="beta", key_id="k3", energy=Energy(40.0, "nvml"), ago_s=840,
             ttft=0.4, gen_s=3.0, e2e=3.2),
        Spec("large", 800, 0, 150, tenant="beta", key_id="k3", route="default", ago_s=700, ttft=0.3, gen_s=2.0,
             e2e=2.1, over_budget=True, savings={"route": {"tokens": 0, "usd": 0.0003}}),
        Spec("large", 900, 0, 120, cache="semantic", tenant="beta", key_id="k3", ago_s=650, ttft=None),
        Spec("small", 50, 0, 7, finish="cancelled", ago_s=600, ttft=0.06, gen_s=0.2, e2e=0.25),
        Spec("large", 400, 0, 30, finish="error", ago_s=500, ttft=0.2, gen_s=0.6, e2e=0.7),
        Spec(None, status=404, error_code="model_not_found", finish=None, ttft=None, ago_s=400, e2e=0.002),
        Spec("small", status=429, error_code="budget_exceeded", finish=None, ttft=None, key_id="k2", ago_s=300,
             e2e=0.001),
        Spec("small", 80, 64, 1, route="default", ago_s=200, ttft=0.04, gen_s=0.04, e2e=0.05),
        Spec("small", 200, 128, 90, key_id=None, tenant="default", ago_s=100, ttft=0.07, gen_s=1.1, e2e=1.2,
             savings={"route": (0, 0.000003)}),
    ]


class HandCounter:
    """A joule counter the test turns by hand, to check the meter's arithmetic exactly."""

    name = "rapl"

    def __init__(self) -> None:
        self.j = 100.0

    def read_joules(self) -> float:
        return self.j

    def memory_bytes(self) -> int | None:
        return None

    def power_watts(self) -> float | None:
        return None

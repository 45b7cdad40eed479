"""Routes replayed: which model a candidate router would have chosen for each recorded generation.

Only generated rows are routed (a response-cache hit never reaches the route stage). The request's model or
route comes from its stored body, or else from the row (`route` when one was asked, else the pinned model).
The route stage's own `choose` decides, so rules, the classifier and fixed routes act as they would live. What
it cannot know offline is said in `notes`:
- rules and the classifier read the prompt: a routed row without a stored body is not evaluated;
- cascade: the cheap model's answer decides escalation; the share is of the first model asked;
- load: the queue at the time is not recorded; no model is taken to be over its SLO;
- token: handovers need the small model's confidence at each step; rows are priced as the small model alone, a
  lower bound (docs/token_routing.md measures what handovers add).
The cost of the routed traffic is each row's recorded usage at the chosen model's price (an estimate: another
model's tokenizer and answer lengths differ).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from tokenomy.config import Config
from tokenomy.generation import GenRequest
from tokenomy.pipeline.request import RequestContext
from tokenomy.pipeline.route import Route
from tokenomy.tools.replay.traffic import Recorded, RowPrice, Trace

NEEDS_TEXT = {"rules", "classifier"}


def _asked(q: Recorded) -> str | None:
    if q.prompt is not None:
        return q.prompt.gen_request().model
    return q.row.route or q.row.model


def replay_routes(trace: Trace, config: Config) -> dict[str, Any]:
    models = [m.name for m in config.models]
    prices: Mapping[str, Any] = {m.name: m.price for m in config.models}
    stage = Route(models, dict(config.routes))
    chosen: Counter[str] = Counter()
    recorded: Counter[str] = Counter()
    cost = recorded_cost = 0.0
    agree = evaluated = 0
    skipped: Counter[str] = Counter()
    notes: set[str] = set()
    for q in trace.requests:
        if not q.generated:
            continue
        r = q.row
        asked = _asked(q)
        spec = config.routes.get(asked or "")
        if spec is None and asked not in models:
            skipped[f"{asked!r} is neither a model nor a route of the candidate config"] += 1
            continue
        if spec is None:
            model = asked
        else:
            if q.prompt is None and NEEDS_TEXT & set(spec.strategies):
                skipped["routed by rules or classifier, and no stored body"] += 1
                continue
            gen = q.prompt.gen_request() if q.prompt is not None else GenRequest(model=asked or "")
            ctx = RequestContext(gen=gen, headers=q.prompt.headers if q.prompt else {}, tenant=r.tenant,
                                 request_id=r.request_id, prompt_tokens=r.prompt_tokens)
            ladder, _, _ = stage.choose(spec, ctx)
            model = ladder[0]
            if "cascade" in spec.strategies:
                notes.add("cascade: escalations need the cheap model's answer; shares are of the first model asked")
            if "load" in spec.strategies:
                notes.add("load: queue waits are not recorded; no model is taken to be over its SLO")
            if "token" in spec.strategies:
                notes.add("token: handovers need the small model's per-step confidence; priced as the small "
                          "model alone, a lower bound")
        assert model is not None
        evaluated += 1
        chosen[model] += 1
        recorded[r.model or ""] += 1
        agree += model == r.model
        cost += q.usage_cost(prices.get(model) or RowPrice.of(r))
        recorded_cost += r.cost_usd
    return {"evaluated": evaluated, "skipped": dict(skipped), "notes": sorted(notes),
            "chosen": dict(sorted(chosen.items())), "recorded": dict(sorted(recorded.items())),
            "agreement": agree / evaluated if evaluated else None,
            "cost_usd": cost, "recorded_cost_usd": recorded_cost}

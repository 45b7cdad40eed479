"""The same traffic at other prices, from the rows alone (token counts and recorded prices; no body needed).

    recomputed         = sum over generated rows of cost(recorded prices, recorded usage)
                         (equals the recorded cost unless a cascade paid for discarded answers, which a row's
                         usage does not show)
    candidate prices   = the same usage at the candidate config's price for the model that served it
    all on model X     = every generated row's usage at X's price (X's own tokenizer and answer lengths would
                         differ: an estimate)
    no prompt caching  = cached prompt tokens, and those written to a prompt cache, charged at the full input price
    no response cache  = the recorded cost plus what each cache hit's answer cost to generate
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenomy.tools.replay.traffic import RowPrice, Trace


def price_policies(trace: Trace, prices: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """[{name, cost_usd}] for each price policy; `prices` the candidate config's by model (None: none given)."""
    generated = [q for q in trace.requests if q.generated]
    recorded = sum(q.row.cost_usd for q in trace.requests)
    out = [{"name": "recorded", "cost_usd": recorded},
           {"name": "recomputed from tokens x recorded prices",
            "cost_usd": sum(q.usage_cost(RowPrice.of(q.row)) for q in generated)}]
    if prices:
        out.append({"name": "candidate config's prices", "cost_usd": sum(
            q.usage_cost(prices.get(q.row.model or "", RowPrice.of(q.row))) for q in generated)})
    every = dict(trace.recorded_prices())
    every.update(prices or {})
    for model, price in sorted(every.items()):
        out.append({"name": f"all on {model}", "cost_usd": sum(q.usage_cost(price) for q in generated)})

    def uncached(p: RowPrice) -> RowPrice:
        return RowPrice(p.input, p.input, p.output, p.notional, cache_write=p.input)

    out.append({"name": "no prompt caching (cached input at full price)",
                "cost_usd": sum(q.usage_cost(uncached(RowPrice.of(q.row))) for q in generated)})
    out.append({"name": "no response cache", "cost_usd": recorded + sum(
        q.generation_cost for q in trace.requests if q.row.cache_hit)})
    for p in out:
        p["vs_recorded"] = p["cost_usd"] / recorded - 1 if recorded else None
    return out

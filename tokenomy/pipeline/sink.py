"""The meter's record sink: a finished RequestContext -> a ledger row, cost and saving metrics, budget spend.

The Record stage calls it for every request (errors, cache hits and rejections too). It observes only: any
failure here is logged by Record and never reaches the response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

from tokenomy.hardware.energy import EnergyAccount
from tokenomy.ledger.ledger import Ledger
from tokenomy.ledger.pricing import PriceLike, price_of, route_saving, usage_cost, usage_counts
from tokenomy.ledger.prompts import FinishedRequest, prompt_from_context
from tokenomy.ledger.row import CACHE_HITS, Finished, LedgerRow, Saving, row_from_context
from tokenomy.limits.budget import Budgets

log = logging.getLogger("tokenomy.record")


class MeterSink:
    def __init__(self, ledger: Ledger | None, prices: Mapping[str, PriceLike], metrics: Any = None,
                 budgets: Budgets | None = None, energy: EnergyAccount | None = None,
                 backends: Mapping[str, str] | None = None,
                 on_row: list[Callable[[LedgerRow], None]] | None = None,
                 store_prompts: Callable[[str], bool] | None = None) -> None:
        """`prices` and `backends` (embedded | openai | anthropic) are by model name; `energy` holds per-request joules
        keyed by request id; `on_row` gets every row after it is queued; `store_prompts(tenant)` says whether
        the request's body and answer are stored beside its row (None: never)."""
        self.ledger = ledger
        self.prices = prices
        self.metrics = metrics
        self.budgets = budgets
        self.energy = energy
        self.backends = backends or {}
        self.on_row = on_row or []
        self.store_prompts = store_prompts

    def price_for(self, ctx: Finished) -> PriceLike | None:
        """The served model's price (its batch price for a batch request); a cache hit that set no model is priced
        as the model asked for."""
        for name in (ctx.model, ctx.asked_model):
            if name is not None and name in self.prices:
                return self.rate(name, ctx)
        return None

    def rate(self, model: str, ctx: Finished) -> PriceLike | None:
        """A model's price for this request: its batch price (config.Price.for_batch) for a batch request."""
        return price_of(self.prices, model, ctx.batch_id is not None)

    def top_price(self, ctx: Finished) -> PriceLike | None:
        """The price of the route's most capable candidate (the last; routes list models cheapest first) when a
        cheaper model served the request; None when it was not routed, was a cache hit, or the top model served."""
        if ctx.route is None or ctx.cache in CACHE_HITS or ctx.usage is None:
            return None
        candidates = ctx.route_candidates
        if not candidates or ctx.model is None or candidates[-1] == ctx.model:
            return None
        return self.rate(candidates[-1], ctx)

    def route_saving(self, ctx: Finished) -> dict[str, Saving]:
        """A route that served on a cheaper model than its most capable candidate saved the difference in price
        for the same usage (an answer several models wrote: price_parts)."""
        if ctx.usage is not None and ctx.usage.parts:
            return {}
        top = self.top_price(ctx)
        served = self.rate(ctx.model, ctx) if top is not None and ctx.model is not None else None
        if top is None or served is None or ctx.usage is None:
            return {}
        usd = route_saving(top, served, *usage_counts(ctx.usage))
        return {"route": Saving(0, usd)} if usd > 0 else {}

    def price_parts(self, ctx: Finished, row: LedgerRow) -> None:
        """An answer several models wrote (token-level routing; Usage.parts) is priced part by part, each at its
        own model's price; a route saving is then what the route's most capable model would have cost for the
        same tokens, less that."""
        u = ctx.usage
        if u is None or not u.parts or ctx.cache in CACHE_HITS:
            return
        row.cost_input_usd = row.cost_cached_input_usd = row.cost_cache_write_usd = row.cost_output_usd = 0.0
        row.parts = []
        for model, part in u.parts:
            price = self.rate(model, ctx)
            c = usage_cost(price, part) if price is not None else None
            row.parts.append({"model": model, "prompt_tokens": part.prompt_tokens,
                              "cached_tokens": part.cached_tokens, "completion_tokens": part.completion_tokens,
                              "cost_usd": c.total_usd if c is not None else 0.0})
            if c is None:
                continue
            row.cost_input_usd += c.input_usd
            row.cost_cached_input_usd += c.cached_input_usd
            row.cost_cache_write_usd += c.cache_write_usd
            row.cost_output_usd += c.output_usd
        row.cost_usd = row.cost_input_usd + row.cost_cached_input_usd + row.cost_cache_write_usd + row.cost_output_usd
        top = self.top_price(ctx)
        if top is not None:
            usd = usage_cost(top, u).total_usd - row.cost_usd
            if usd > 0:
                row.saved_by["route"] = {"tokens": 0, "usd": usd}
                row.saved_usd += usd

    def add_escalations(self, ctx: Finished, row: LedgerRow) -> None:
        """A cascade's discarded cheaper answers were generated and are paid for: their cost joins the row
        (the token columns stay the usage the client received)."""
        for model, usage in ctx.escalations:
            price = self.rate(model, ctx)
            if price is None or usage is None:
                continue
            c = usage_cost(price, usage)
            row.cost_input_usd += c.input_usd
            row.cost_cached_input_usd += c.cached_input_usd
            row.cost_cache_write_usd += c.cache_write_usd
            row.cost_output_usd += c.output_usd
            row.cost_usd += c.total_usd

    def __call__(self, ctx: Finished) -> None:
        """Write the request's ledger row, count its cost and savings, charge its budgets, and set
        `ctx.cost_usd` (which the response's x-tokenomy-cost-usd header reads)."""
        energy = self.energy.pop(ctx.request_id) if self.energy is not None else None
        model = ctx.model or ctx.asked_model
        row = row_from_context(ctx, self.price_for(ctx), energy, self.backends.get(model),
                               savings=self.route_saving(ctx))
        self.price_parts(ctx, row)
        self.add_escalations(ctx, row)
        ctx.cost_usd = row.cost_usd
        if ctx.schema_problem and row.error_code is None:
            row.error_code, row.error = "schema_invalid", ctx.schema_problem[:500]
        if self.budgets is not None:
            # settled first: the reservation's Redis round trip must not wait behind the ledger's writer thread
            # (which this row wakes) for the interpreter lock; a crash between the two over-counts, never loses
            try:
                self.budgets.record(row)
            except Exception:
                log.exception("budget spend of %s not counted", row.request_id)
        if self.ledger is not None:
            # bodies are kept for replay, which asks the caches and the router again: embeddings pass neither
            keep = self.store_prompts is not None and ctx.api != "embeddings" and self.store_prompts(row.tenant)
            self.ledger.write(row, prompt_from_context(cast(FinishedRequest, ctx), row.ts) if keep else None)
        m = self.metrics
        if m is not None:
            if row.cost_usd:
                m.cost.labels(model).inc(row.cost_usd)
                m.tenant_cost.labels(row.tenant).inc(row.cost_usd)
            for by, s in row.saved_by.items():
                m.saved.labels(by).inc(s["usd"])
                m.tokens.labels("saved", model).inc(s["tokens"])
            if row.energy_j is not None and row.energy_source is not None:
                m.request_energy.labels(model, row.energy_source).inc(row.energy_j)
        for hook in self.on_row:
            hook(row)

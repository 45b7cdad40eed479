"""The recorded traffic replay works from: ledger rows oldest first, each with its stored body when there is one.

A row's generation cost is what a model was paid to answer it: its recorded cost for a generated row, and for a
response-cache hit the stored answer's usage at the row's recorded prices (what a miss would have cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenomy.ledger.pricing import cost
from tokenomy.ledger.prompts import StoredPrompt
from tokenomy.ledger.row import LedgerRow


class ReplayError(ValueError):
    """Input replay cannot work from (an empty window, a bad candidate config); the command prints one line."""


@dataclass(frozen=True)
class RowPrice:
    """The prices a row was charged at (USD per 1M tokens), shaped like config.Price."""

    input: float
    cached_input: float
    output: float
    notional: bool = False
    cache_write: float | None = None     # None: the input price (rows from before cache writes were recorded)

    @classmethod
    def of(cls, row: LedgerRow) -> RowPrice:
        return cls(row.price_input, row.price_cached_input, row.price_output, row.price_notional,
                   row.price_cache_write)


@dataclass
class Recorded:
    row: LedgerRow
    prompt: StoredPrompt | None = None

    @property
    def generated(self) -> bool:
        """A model produced (and was paid for) this answer: usage, not a cache hit."""
        r = self.row
        return not r.cache_hit and r.model is not None and (r.prompt_tokens + r.completion_tokens) > 0

    @property
    def served(self) -> bool:
        """An answer was delivered (from a model or a cache): what a response cache could have served."""
        return self.row.status < 400 and self.row.model is not None and self.row.prompt_tokens > 0

    def usage_cost(self, price: Any) -> float:
        r = self.row
        cached = min(r.cached_tokens, r.prompt_tokens)
        return cost(price, r.prompt_tokens, cached, r.completion_tokens,
                    min(r.cache_write_tokens, r.prompt_tokens - cached)).total_usd

    @property
    def generation_cost(self) -> float:
        r = self.row
        if not r.cache_hit:
            return r.cost_usd
        saved = r.saved_by.get(r.cache)
        return float(saved["usd"]) if saved else self.usage_cost(RowPrice.of(r))


@dataclass
class Trace:
    requests: list[Recorded]
    since: float | None = None
    until: float | None = None

    @property
    def with_bodies(self) -> int:
        return sum(q.prompt is not None for q in self.requests)

    def recorded_prices(self) -> dict[str, RowPrice]:
        """Each model's price as last recorded."""
        out: dict[str, RowPrice] = {}
        for q in self.requests:
            if q.row.model and (q.generated or q.row.cache_hit):
                out[q.row.model] = RowPrice.of(q.row)
        return out


def load_trace(ledger: Any, since: float | None = None, until: float | None = None) -> Trace:
    """Rows with since <= ts < until, oldest first, joined to their stored prompts; ReplayError when none."""
    rows = ledger.query(since=since, until=until)
    if not rows:
        raise ReplayError("the ledger has no rows in this window: nothing to replay")
    bodies = ledger.prompts(since=since, until=until)
    return Trace([Recorded(r, bodies.get(r.request_id)) for r in rows], since, until)

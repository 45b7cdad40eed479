"""What a request cost, and what a cache or a cheaper route saved, from a model's per-1M-token prices.

    cost = ((prompt - cached) * input + cached * cached_input + completion * output) / 1e6

Cached prompt tokens are priced at the cached-input rate: never at the full input rate and never at zero
(LiteLLM #21023 billed them at the full rate, Langfuse #8559 at zero; both are wrong, and a test checks it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

PER = 1e6   # prices are USD per 1M tokens


class PriceLike(Protocol):
    """`tokenomy.config.Price` or anything shaped like it."""

    input: float
    cached_input: float
    output: float
    notional: bool


def price_of(prices: Mapping[str, PriceLike], model: str | None, batch: bool = False) -> PriceLike | None:
    """A model's price for one request, from `prices` by model name (None for a model without one): a batch
    request pays the model's batch price (`config.Price.for_batch`), any other its list price. Every price the
    gateway charges, stores or weighs goes through here."""
    price = prices.get(model) if model is not None else None
    for_batch = getattr(price, "for_batch", None)
    return for_batch() if batch and for_batch is not None else price


@dataclass(frozen=True)
class Cost:
    input_usd: float = 0.0
    cached_input_usd: float = 0.0
    output_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.input_usd + self.cached_input_usd + self.output_usd


def _tokens(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _rate(name: str, value: float) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"price.{name} must be a finite non-negative number (USD per 1M tokens), got {value!r}")
    return float(value)


def cost(price: PriceLike, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Cost:
    """The cost split of one generation; `cached_tokens` are part of `prompt_tokens` (OpenAI's convention)."""
    p, c, o = (_tokens("prompt_tokens", prompt_tokens), _tokens("cached_tokens", cached_tokens),
               _tokens("completion_tokens", completion_tokens))
    if c > p:
        raise ValueError(f"cached_tokens ({c}) cannot exceed prompt_tokens ({p})")
    return Cost(input_usd=(p - c) * _rate("input", price.input) / PER,
                cached_input_usd=c * _rate("cached_input", price.cached_input) / PER,
                output_usd=o * _rate("output", price.output) / PER)


def cache_saving(price: PriceLike, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
    """USD a response-cache hit saved: the full price of the generation it avoided (its usage, re-priced)."""
    return cost(price, prompt_tokens, cached_tokens, completion_tokens).total_usd


def prefix_saving(price: PriceLike, cached_tokens: int) -> float:
    """USD a prefix (prompt) cache saved: cached tokens * (input - cached_input) / 1e6, never below zero."""
    c = _tokens("cached_tokens", cached_tokens)
    return max(0.0, c * (_rate("input", price.input) - _rate("cached_input", price.cached_input)) / PER)


def route_saving(asked: PriceLike, served: PriceLike, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> float:
    """USD a route saved by serving on a cheaper model than the one asked for, same usage; never below zero."""
    return max(0.0, cost(asked, prompt_tokens, cached_tokens, completion_tokens).total_usd
               - cost(served, prompt_tokens, cached_tokens, completion_tokens).total_usd)

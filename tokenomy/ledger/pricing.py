"""What a request cost, and what a cache or a cheaper route saved, from a model's per-1M-token prices.

    cost = ((prompt - cached - written) * input + cached * cached_input + written * cache_write
            + completion * output) / 1e6

Cached prompt tokens are priced at the cached-input rate: never at the full input rate and never at zero (LiteLLM
#21023 billed them at the full rate, Langfuse #8559 at zero; both are wrong, and a test checks it). `written` are
prompt tokens an upstream wrote to its prompt cache (Anthropic's cache_creation_input_tokens), priced at the
model's cache_write rate (its input price unless set: a price without the field, like a replayed row's, too).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tokenomy.generation import Usage

PER = 1e6   # prices are USD per 1M tokens


class PriceLike(Protocol):
    """`tokenomy.config.Price` or anything shaped like it."""

    input: float
    cached_input: float
    output: float
    notional: bool


def cache_write_rate(price: PriceLike) -> float:
    """USD per 1M prompt tokens written to a prompt cache: the price's `cache_write` when it has one, else input."""
    rate = getattr(price, "cache_write", None)
    return price.input if rate is None else rate


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
    cache_write_usd: float = 0.0

    @property
    def total_usd(self) -> float:
        return self.input_usd + self.cached_input_usd + self.cache_write_usd + self.output_usd


def _tokens(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _rate(name: str, value: float) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"price.{name} must be a finite non-negative number (USD per 1M tokens), got {value!r}")
    return float(value)


def cost(price: PriceLike, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
         cache_write_tokens: int = 0) -> Cost:
    """The cost split of one generation; `cached_tokens` and `cache_write_tokens` are parts of `prompt_tokens`
    (OpenAI's convention for cached tokens; Anthropic reports the three apart and usage adds them up)."""
    p, c, o, w = (_tokens("prompt_tokens", prompt_tokens), _tokens("cached_tokens", cached_tokens),
                  _tokens("completion_tokens", completion_tokens), _tokens("cache_write_tokens", cache_write_tokens))
    if c + w > p:
        raise ValueError(f"cached_tokens ({c}) + cache_write_tokens ({w}) cannot exceed prompt_tokens ({p})")
    return Cost(input_usd=(p - c - w) * _rate("input", price.input) / PER,
                cached_input_usd=c * _rate("cached_input", price.cached_input) / PER,
                cache_write_usd=w * _rate("cache_write", cache_write_rate(price)) / PER,
                output_usd=o * _rate("output", price.output) / PER)


def usage_counts(usage: Usage) -> tuple[int, int, int, int]:
    """(prompt, cached, completion, cache write) tokens of a generation's usage, as `cost` takes them, made
    consistent: none below zero, cached tokens within the prompt, cache writes within what is left of it."""
    p = max(usage.prompt_tokens, 0)
    c = min(max(usage.cached_tokens, 0), p)
    return p, c, max(usage.completion_tokens, 0), min(max(usage.cache_write_tokens, 0), p - c)


def usage_cost(price: PriceLike, usage: Usage) -> Cost:
    """`cost` of a generation's usage (its counts made consistent by usage_counts)."""
    return cost(price, *usage_counts(usage))


def cache_saving(price: PriceLike, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                 cache_write_tokens: int = 0) -> float:
    """USD a response-cache hit saved: the full price of the generation it avoided (its usage, re-priced)."""
    return cost(price, prompt_tokens, cached_tokens, completion_tokens, cache_write_tokens).total_usd


def prefix_saving(price: PriceLike, cached_tokens: int) -> float:
    """USD a prefix (prompt) cache saved: cached tokens * (input - cached_input) / 1e6, never below zero."""
    c = _tokens("cached_tokens", cached_tokens)
    return max(0.0, c * (_rate("input", price.input) - _rate("cached_input", price.cached_input)) / PER)


def route_saving(asked: PriceLike, served: PriceLike, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int, cache_write_tokens: int = 0) -> float:
    """USD a route saved by serving on a cheaper model than the one asked for, same usage; never below zero."""
    u = (prompt_tokens, cached_tokens, completion_tokens, cache_write_tokens)
    return max(0.0, cost(asked, *u).total_usd - cost(served, *u).total_usd)

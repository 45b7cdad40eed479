from __future__ import annotations

import pytest

from tokenomy.config import Price
from tokenomy.ledger.pricing import cache_saving, cost, prefix_saving, route_saving

PRICE = Price(input=3.0, cached_input=0.3, output=15.0)


def test_cost_splits_uncached_cached_and_output():
    c = cost(PRICE, prompt_tokens=10_000, cached_tokens=8_000, completion_tokens=500)
    assert c.input_usd == pytest.approx(2_000 * 3.0 / 1e6)
    assert c.cached_input_usd == pytest.approx(8_000 * 0.3 / 1e6)
    assert c.output_usd == pytest.approx(500 * 15.0 / 1e6)
    assert c.total_usd == pytest.approx(c.input_usd + c.cached_input_usd + c.output_usd)


def test_cached_input_is_priced_as_cached_input_never_full_nor_zero():
    """LiteLLM #21023 billed cached prompt tokens at the full input rate; Langfuse #8559 priced them at zero.
    Both are wrong: the cached part of the prompt is billed at the cached-input rate."""
    cached = cost(PRICE, 10_000, 10_000, 0).total_usd
    as_full = cost(PRICE, 10_000, 0, 0).total_usd           # the LiteLLM #21023 error
    assert cached == pytest.approx(10_000 * 0.3 / 1e6)
    assert cached != pytest.approx(as_full)
    assert cached > 0                                          # the Langfuse #8559 error
    # Each cached token moves exactly (input - cached_input) / 1e6 off the bill.
    assert cost(PRICE, 10_000, 1, 0).total_usd == pytest.approx(as_full - (3.0 - 0.3) / 1e6)


def test_savings():
    assert cache_saving(PRICE, 1000, 200, 100) == pytest.approx(cost(PRICE, 1000, 200, 100).total_usd)
    assert prefix_saving(PRICE, 4000) == pytest.approx(4000 * (3.0 - 0.3) / 1e6)
    # a cached rate above the input rate saves nothing rather than a negative amount
    assert prefix_saving(Price(input=1.0, cached_input=2.0, output=1.0), 100) == 0.0
    cheap = Price(input=0.1, cached_input=0.01, output=0.4)
    assert route_saving(PRICE, cheap, 1000, 0, 100) == pytest.approx((1000 * 2.9 + 100 * 14.6) / 1e6)
    assert route_saving(cheap, PRICE, 1000, 0, 100) == 0.0


@pytest.mark.parametrize("args,fragment", [
    ((-1, 0, 0), "prompt_tokens"),
    ((10, 11, 0), "cannot exceed"),
    ((10, 0, 1.5), "completion_tokens"),
    ((True, 0, 0), "prompt_tokens"),
])
def test_bad_token_counts_are_clear_errors(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        cost(PRICE, *args)


def test_bad_price_is_a_clear_error():
    class Bad:
        input, cached_input, output, notional = float("nan"), 0.0, 0.0, False

    with pytest.raises(ValueError, match="price.input"):
        cost(Bad(), 1, 0, 0)


def test_cache_writes_are_priced_at_their_own_rate_and_default_to_input():
    """Anthropic reports prompt tokens written to its prompt cache apart (cache_creation_input_tokens) and bills
    them above the input price; they are part of prompt_tokens, like cached tokens."""
    from tokenomy.generation import Usage
    from tokenomy.ledger.pricing import usage_cost

    claude = Price(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)
    c = cost(claude, prompt_tokens=1220, cached_tokens=1000, completion_tokens=6, cache_write_tokens=200)
    assert (c.input_usd, c.cached_input_usd, c.cache_write_usd, c.output_usd) == pytest.approx(
        (20 * 3.0 / 1e6, 1000 * 0.3 / 1e6, 200 * 3.75 / 1e6, 6 * 15.0 / 1e6))
    assert c.total_usd == pytest.approx(c.input_usd + c.cached_input_usd + c.cache_write_usd + c.output_usd)
    # no cache_write price: a write costs what input costs (and a price without the field, e.g. a replayed row's)
    assert cost(PRICE, 1000, 0, 0, 400).total_usd == pytest.approx(cost(PRICE, 1000, 0, 0).total_usd)
    with pytest.raises(ValueError, match="cannot exceed"):
        cost(claude, 100, 60, 0, 50)
    # usage as a backend reports it, made consistent before pricing
    assert usage_cost(claude, Usage(prompt_tokens=1220, cached_tokens=1000, cache_write_tokens=200,
                                    completion_tokens=6)).total_usd == pytest.approx(c.total_usd)
    assert usage_cost(claude, Usage(prompt_tokens=100, cached_tokens=80, cache_write_tokens=50)).cache_write_usd == \
        pytest.approx(20 * 3.75 / 1e6)
    batch = claude.for_batch()
    assert batch.cache_write == pytest.approx(3.75 * 0.5) and PRICE.for_batch().cache_write is None

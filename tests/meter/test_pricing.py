from __future__ import annotations

import pytest

from tokenomy.config import Price
from tokenomy.meter.pricing import cache_saving, cost, prefix_saving, route_saving

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

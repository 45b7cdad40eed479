"""An answer several models wrote (token-level routing, Usage.parts): each part is priced at its own model's price,
the route saving is what the route's most capable model would have cost less that, and the ledger keeps the parts,
handovers and speculative draft counts (migration 7). No model runs: the usage is written down."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.helpers.synthetic import Spec, rows_for
from tokenomy.config import Price
from tokenomy.generation import GenRequest, Usage
from tokenomy.ledger import tables as schema
from tokenomy.ledger.ledger import Ledger, normalize_url
from tokenomy.metrics.prometheus import Metrics
from tokenomy.pipeline.record import Record
from tokenomy.pipeline.request import RequestContext, RouteDecision
from tokenomy.pipeline.sink import MeterSink

# "l" costs ten times "s" on every rate.
CHEAP = Price(input=0.1, cached_input=0.025, output=0.4)
PRICES = {"s": CHEAP, "l": Price(input=1.0, cached_input=0.25, output=4.0)}


def usd(price: Price, prompt: int, cached: int, completion: int) -> float:
    """The price of one usage, by the formula the docs give (per 1M tokens, cached input at its own rate)."""
    return ((prompt - cached) * price.input + cached * price.cached_input + completion * price.output) / 1e6


def parts_usage(s: tuple[int, int, int], lg: tuple[int, int, int], **extra) -> Usage:
    """What the token router reports: each model's (prompt, cached, completion) and their sums on top."""
    parts = [(name, Usage(prompt_tokens=p, cached_tokens=c, completion_tokens=o)) for name, (p, c, o) in
             (("s", s), ("l", lg))]
    return Usage(prompt_tokens=s[0] + lg[0], cached_tokens=s[1] + lg[1], completion_tokens=s[2] + lg[2],
                 parts=parts, **extra)


def token_context(rid: str, usage: Usage | None, served: str = "s") -> RequestContext:
    """A request on route "tok" ([s, l], token strategy) that the small model served, as the pipeline leaves it."""
    ctx = RequestContext(gen=GenRequest(model="tok"), request_id=rid)
    ctx.route, ctx.model, ctx.usage, ctx.finish_reason = "tok", served, usage, "stop"
    ctx.route_decision = RouteDecision(candidates=["s", "l"], chosen=served, by="token", route="tok")
    return ctx


def whole(u: Usage, price: Price) -> float:
    return usd(price, u.prompt_tokens, u.cached_tokens, u.completion_tokens)


def test_each_part_is_priced_at_its_models_price_and_the_ledger_keeps_it(ledger_url):
    metrics = Metrics()
    s, lg = (400, 256, 90), (430, 0, 12)
    routed = parts_usage(s, lg, handovers=3, draft_tokens=40, draft_accepted=31)
    plain = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=20)
    want = usd(PRICES["s"], *s) + usd(PRICES["l"], *lg)
    with Ledger(ledger_url) as led:
        record = Record(metrics, sinks=[MeterSink(led, PRICES, metrics)])
        ctxs = [token_context("r_parts", routed), token_context("r_plain", plain)]
        for ctx in ctxs:
            record.finish(ctx)
        assert led.flush()
        rows = {r.request_id: r for r in led.query()}
    row = rows["r_parts"]
    # Not the single-price cost the served model's rate would give for the summed usage.
    assert want != pytest.approx(whole(routed, CHEAP))
    assert row.cost_usd == pytest.approx(want) and ctxs[0].cost_usd == pytest.approx(want)
    assert row.cost_input_usd + row.cost_cached_input_usd + row.cost_output_usd == pytest.approx(want)
    assert row.cost_cached_input_usd == pytest.approx(s[1] * CHEAP.cached_input / 1e6)
    assert row.parts == [
        {"model": "s", "prompt_tokens": s[0], "cached_tokens": s[1], "completion_tokens": s[2],
         "cost_usd": pytest.approx(usd(PRICES["s"], *s))},
        {"model": "l", "prompt_tokens": lg[0], "cached_tokens": lg[1], "completion_tokens": lg[2],
         "cost_usd": pytest.approx(usd(PRICES["l"], *lg))},
    ]
    assert (row.handovers, row.draft_tokens, row.draft_accepted) == (3, 40, 31)
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (830, 256, 102)   # the sums
    other = rows["r_plain"]
    assert other.parts is None and other.handovers is None and other.draft_tokens is None
    assert other.cost_usd == pytest.approx(whole(plain, CHEAP))
    # Token counters count each part under the model that wrote it; the cost counter follows the ledger rows.
    get = metrics.registry.get_sample_value
    assert get("tokenomy_tokens_total", {"kind": "completion", "model": "l"}) == lg[2]
    assert get("tokenomy_tokens_total", {"kind": "completion", "model": "s"}) == s[2] + plain.completion_tokens
    assert get("tokenomy_tokens_total", {"kind": "prompt", "model": "l"}) == lg[0]
    assert get("tokenomy_cost_usd_total", {"model": "s"}) == pytest.approx(want + other.cost_usd)


def test_a_batch_request_prices_each_part_at_its_batch_price():
    seen = []
    sink = MeterSink(None, PRICES, on_row=[seen.append])
    s, lg = (100, 0, 50), (120, 0, 5)
    ctx = token_context("r_b", parts_usage(s, lg))
    ctx.batch_id = "batch_1"
    sink(ctx)
    want = usd(PRICES["s"].for_batch(), *s) + usd(PRICES["l"].for_batch(), *lg)
    assert seen[0].cost_usd == pytest.approx(want) and want < usd(PRICES["s"], *s) + usd(PRICES["l"], *lg)


def route_row(usage: Usage, prices=PRICES):
    seen = []
    MeterSink(None, prices, on_row=[seen.append])(token_context("r", usage))
    return seen[0]


def test_the_route_saving_is_the_top_model_for_the_whole_usage_less_the_parts():
    u = parts_usage((400, 256, 90), (430, 0, 12))
    row = route_row(u)
    parts = sum(p["cost_usd"] for p in row.parts)
    assert row.saved_by["route"] == {"tokens": 0, "usd": pytest.approx(whole(u, PRICES["l"]) - parts)}
    # The other savings (the prefix cache's) are untouched, and the totals still add up.
    assert row.saved_usd == pytest.approx(sum(v["usd"] for v in row.saved_by.values()))
    assert row.saved_tokens == sum(int(v["tokens"]) for v in row.saved_by.values())


def test_parts_that_cost_more_than_the_top_model_would_record_no_route_saving():
    # "s" is cheaper on input and dearer on output: for the summed usage it is the cheaper model (so a route
    # saving is found for it), but here it wrote the output and "l" read most of the prompt.
    prices = {"s": Price(input=0.1, output=5.0), "l": Price(input=1.0, output=1.0)}
    u = parts_usage((100, 0, 200), (2000, 0, 5))
    assert whole(u, prices["s"]) < whole(u, prices["l"])
    row = route_row(u, prices)
    assert row.cost_usd > whole(u, prices["l"])
    assert "route" not in row.saved_by and row.saved_usd == 0.0 and row.saved_tokens == 0


def test_parts_cheaper_than_the_top_model_save_even_where_the_served_model_alone_would_not():
    # The reverse: "s" is dearer on input, so for the summed usage it costs more than "l", but it wrote the long
    # answer at its cheap output rate and "l" read its prompt at l's input rate: the answer cost less than l alone.
    prices = {"s": Price(input=2.0, output=0.1), "l": Price(input=1.0, output=1.0)}
    u = parts_usage((100, 0, 500), (2000, 0, 5))
    assert whole(u, prices["s"]) > whole(u, prices["l"])
    row = route_row(u, prices)
    assert row.cost_usd < whole(u, prices["l"])
    assert row.saved_by["route"]["usd"] == pytest.approx(whole(u, prices["l"]) - row.cost_usd)


def test_a_part_of_an_unpriced_model_costs_nothing_and_the_rest_is_still_priced():
    row = route_row(parts_usage((100, 0, 50), (120, 0, 5)), {"s": CHEAP})
    assert [p["cost_usd"] for p in row.parts] == [pytest.approx(usd(CHEAP, 100, 0, 50)), 0.0]
    assert row.cost_usd == pytest.approx(usd(CHEAP, 100, 0, 50)) and "route" not in row.saved_by


def test_a_cache_hit_is_not_priced_by_parts():
    ctx = token_context("r_hit", parts_usage((100, 0, 50), (120, 0, 5)))
    ctx.cache = "exact"
    seen = []
    MeterSink(None, PRICES, on_row=[seen.append])(ctx)
    assert seen[0].parts is None and seen[0].cost_usd == 0.0


def test_a_version_6_ledger_migrates_to_7_and_keeps_its_rows(ledger_url):
    engine = sa.create_engine(normalize_url(ledger_url))
    old = rows_for([Spec("small", 10, 0, 2, ago_s=20), Spec("large", 30, 0, 4, ago_s=10)])
    with engine.begin() as conn:
        assert schema.migrate(conn, upto=6) == (0, 6)
        v6 = sa.Table("ledger", sa.MetaData(), autoload_with=conn)
        assert "batch" in v6.c and not {"draft_tokens", "draft_accepted", "handovers", "parts"} & set(v6.c.keys())
        conn.execute(v6.insert(), [{k: v for k, v in r.to_db().items() if k in v6.c} for r in old])
    engine.dispose()
    with Ledger(ledger_url) as led:
        with led.engine.connect() as conn:
            assert schema.current_version(conn) == len(schema.MIGRATIONS)
        got = led.query()
        assert [r.request_id for r in got] == [r.request_id for r in old]
        assert [r.cost_usd for r in got] == pytest.approx([r.cost_usd for r in old])
        for r in got:
            assert (r.draft_tokens, r.draft_accepted, r.handovers, r.parts) == (None, None, None, None)
        # and the migrated table takes the new columns
        MeterSink(led, PRICES)(token_context("r_new", parts_usage((10, 0, 5), (12, 0, 1), handovers=1)))
        assert led.flush()
        new = led.get("r_new")
    assert new is not None and new.handovers == 1 and [p["model"] for p in new.parts] == ["s", "l"]


def test_parts_round_trip_as_json_text():
    [row] = rows_for([Spec("small", 10, 0, 2)])
    assert row.to_db()["parts"] is None
    row.parts = [{"model": "s", "prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 2, "cost_usd": 0.5}]
    db = row.to_db()
    assert isinstance(db["parts"], str)
    assert type(row).from_db(db) == row

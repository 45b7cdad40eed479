"""The record sink, wired to the real Record stage as the gateway will wire it."""

from __future__ import annotations

import time

import pytest

from tests.helpers.synthetic import BACKENDS, PRICES, HandCounter, Spec, context, mixed
from tokenomy.config import BudgetLimits
from tokenomy.hardware.energy import EnergyAccount, EnergyMeter
from tokenomy.ledger.ledger import Ledger
from tokenomy.limits.budget import Budgets
from tokenomy.metrics.prometheus import Metrics
from tokenomy.pipeline.record import Record
from tokenomy.pipeline.request import RequestContext, RouteDecision
from tokenomy.pipeline.sink import MeterSink


def test_every_recorded_request_reaches_ledger_metrics_and_budgets(tmp_path):
    metrics = Metrics()
    clock, src = [0.0], HandCounter()
    energy = EnergyAccount(EnergyMeter(src, clock=lambda: clock[0]))
    budgets = Budgets(tenants={"beta": BudgetLimits(tokens_per_day=10_000)})
    seen = []
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        metrics.watch_ledger(led)
        sink = MeterSink(led, PRICES, metrics, budgets, energy, BACKENDS, on_row=[seen.append])
        record = Record(metrics, sinks=[sink])
        specs = mixed()
        ctxs: list[RequestContext] = [context(s, f"req_{i:04d}", time.time()) for i, s in enumerate(specs)]
        clock[0] += 1.0
        src.j += 9.0                                           # one engine step shared by two requests
        energy.on_step(1.0, {ctxs[0].request_id: 2, ctxs[1].request_id: 1})
        for ctx in ctxs:
            record.finish(ctx)
        led.flush()
        rows = {r.request_id: r for r in led.query()}
        assert metrics.registry.get_sample_value("tokenomy_ledger_rows_written_total") == len(specs)
    assert len(rows) == len(specs) and [r.request_id for r in seen] == [c.request_id for c in ctxs]
    assert rows["req_0000"].energy_j == pytest.approx(6.0) and rows["req_0001"].energy_j == pytest.approx(3.0)
    assert rows["req_0000"].energy_source == "rapl" and len(energy) == 0
    assert rows["req_0003"].backend == "openai" and rows["req_0000"].backend == "embedded"
    get = metrics.registry.get_sample_value
    for model in ("small", "large"):
        assert get("tokenomy_cost_usd_total", {"model": model}) == pytest.approx(
            sum(r.cost_usd for r in rows.values() if r.model == model))
    for layer in ("exact", "semantic", "prefix", "route"):
        assert (get("tokenomy_saved_usd_total", {"by": layer}) or 0.0) == pytest.approx(
            sum(r.saved_by.get(layer, {}).get("usd", 0.0) for r in rows.values())), layer
    assert get("tokenomy_request_energy_joules_total", {"model": "small", "source": "rapl"}) == pytest.approx(9.0)
    assert budgets.used("tenant", "beta", "day")[1] == sum(r.billed_tokens for r in rows.values()
                                                           if r.tenant == "beta")


def test_a_cache_hit_without_a_model_is_priced_as_the_model_asked_for():
    sink = MeterSink(None, PRICES)
    ctx = context(Spec(None, 100, 0, 20, cache="exact"), "r1", time.time())
    ctx.gen.model = "large"
    seen = []
    sink.on_row.append(seen.append)
    sink(ctx)
    assert seen[0].saved_by["exact"]["usd"] == pytest.approx((100 * 0.2 + 20 * 0.6) / 1e6)


def test_a_closed_ledger_never_breaks_the_request_path(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.close()
    record = Record(Metrics(), sinks=[MeterSink(led, PRICES)])
    record.finish(context(Spec("small", 10, 0, 1), "r1", time.time()))
    assert led.dropped == 1


def test_a_route_that_served_cheaper_saves_the_price_difference():
    seen = []
    sink = MeterSink(None, PRICES, on_row=[seen.append])
    for served in ("small", "large"):
        ctx = context(Spec(served, 1000, 200, 100, route="auto"), f"r_{served}", time.time())
        ctx.route_decision = RouteDecision(candidates=["small", "large"], chosen=served, by="rules", route="auto")
        sink(ctx)
    big, small = PRICES["large"], PRICES["small"]
    want = ((800 * (big.input - small.input) + 200 * (big.cached_input - small.cached_input)
             + 100 * (big.output - small.output)) / 1e6)
    assert seen[0].saved_by["route"] == {"tokens": 0, "usd": pytest.approx(want)}
    assert "route" not in seen[1].saved_by                  # served on the most capable model: nothing saved


def test_a_batch_request_is_marked_and_priced_at_its_models_batch_price(tmp_path):
    from tokenomy.config import Price
    from tokenomy.generation import GenRequest, Usage

    prices = {"m": Price(input=1.0, cached_input=0.5, output=2.0, batch_discount=0.5)}
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        sink = MeterSink(led, prices)
        for rid, batch in (("req_i", None), ("req_b", "batch_1")):
            ctx = RequestContext(gen=GenRequest(model="m"), request_id=rid, batch_id=batch)
            ctx.model, ctx.usage, ctx.finish_reason = "m", Usage(prompt_tokens=1000, completion_tokens=500), "stop"
            sink(ctx)
        led.flush()
        rows = {r.request_id: r for r in led.query()}
    assert rows["req_i"].batch is None and rows["req_i"].cost_usd == pytest.approx(0.002)
    assert rows["req_b"].batch == "batch_1" and rows["req_b"].cost_usd == pytest.approx(0.001)
    assert (rows["req_b"].price_input, rows["req_b"].price_output) == (0.5, 1.0)

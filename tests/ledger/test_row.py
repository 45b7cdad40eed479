from __future__ import annotations

import time

import pytest

from tests.helpers.synthetic import PRICES, Spec, context, rows_for
from tokenomy.hardware.energy import Energy
from tokenomy.ledger.pricing import cost
from tokenomy.ledger.row import CacheSaving, LedgerRow, Saving, row_from_context

SMALL, LARGE = PRICES["small"], PRICES["large"]


def test_generated_request_is_priced_and_timed():
    [row] = rows_for([Spec("large", 1000, 400, 50, route="default", ttft=0.2, gen_s=1.2, queue=0.03,
                           energy=Energy(7.5, "nvml"))])
    c = cost(LARGE, 1000, 400, 50)
    assert (row.cost_input_usd, row.cost_cached_input_usd, row.cost_output_usd) == pytest.approx(
        (600 * 0.20 / 1e6, 400 * 0.05 / 1e6, 50 * 0.60 / 1e6))
    assert row.cost_usd == pytest.approx(c.total_usd)
    assert (row.price_input, row.price_cached_input, row.price_output, row.price_notional) == (0.2, 0.05, 0.6, False)
    assert row.tpot_s == pytest.approx((1.2 - 0.2) / 49)
    assert (row.queue_s, row.ttft_s) == (0.03, 0.2)
    assert row.saved_by == {"prefix": {"tokens": 400, "usd": pytest.approx(400 * (0.20 - 0.05) / 1e6)}}
    assert (row.energy_j, row.energy_source, row.energy_label) == (7.5, "nvml", "measured")
    assert (row.backend, row.route, row.model, row.tenant, row.key_id) == ("openai", "default", "large", "acme", "k1")
    assert row.billed_tokens == 1050 and row.delivered_tokens == 50 and row.ok


def test_cache_hit_costs_nothing_and_saves_the_generation_it_avoided():
    [row] = rows_for([Spec("small", 300, 100, 60, cache="exact", energy=Energy(1.0, "estimate"))])
    assert row.cost_usd == 0 and row.cost_input_usd == 0 and row.cost_output_usd == 0
    assert row.saved_by == {"exact": {"tokens": 360, "usd": pytest.approx(cost(SMALL, 300, 100, 60).total_usd)}}
    assert row.saved_tokens == 360
    assert row.ttft_s is None and row.tpot_s is None and row.queue_s is None
    assert row.energy_j is None                     # nothing ran, nothing to attribute
    assert row.billed_tokens == 0 and row.delivered_tokens == 60


def test_savings_the_caller_found_are_kept():
    ctx = context(Spec("small", 100, 0, 10), "r1", time.time())
    row = row_from_context(ctx, SMALL, savings={"route": Saving(0, 0.002), "exact": (40, 8e-7)})
    assert row.saved_by == {"route": {"tokens": 0, "usd": 0.002}, "exact": {"tokens": 40, "usd": 8e-7}}
    assert row.saved_usd == pytest.approx(0.002 + 8e-7) and row.saved_tokens == 40


def test_errors_and_rejections_still_make_a_row():
    rows = rows_for([Spec(None, status=404, error_code="model_not_found", finish=None),
                     Spec("small", status=429, error_code="budget_exceeded", finish=None),
                     Spec("small", 50, 0, 7, finish="cancelled")])
    assert [r.status for r in rows] == [404, 429, 200]
    assert rows[0].model is None and rows[0].cost_usd == 0 and rows[0].error_code == "model_not_found"
    assert rows[0].error == "failed req_0000"
    assert not rows[1].ok and not rows[2].ok                # a cancelled stream delivered nothing useful
    assert rows[2].cost_usd > 0 and rows[2].billed_tokens == 57


def test_cached_above_prompt_is_clamped_not_a_crash():
    ctx = context(Spec("small", 10, 0, 1), "r1", time.time())
    ctx.usage.cached_tokens = 99            # a confused upstream
    row = row_from_context(ctx, SMALL)
    assert row.cached_tokens == 10 and row.cost_usd == pytest.approx(cost(SMALL, 10, 10, 1).total_usd)


def test_times_are_arrival_and_end_to_end():
    now, t0 = time.time(), time.perf_counter()
    ctx = context(Spec("small", 10, 0, 2, e2e=2.0), "r1", now)        # started 2 s before it was made
    row = row_from_context(ctx, SMALL, now=now)
    took = time.perf_counter() - t0                                     # however long the two calls took
    assert 2.0 - 1e-9 <= row.e2e_s <= 2.0 + took + 1e-9                 # (1e-9: the clock's float rounding)
    assert row.ts == pytest.approx(now - row.e2e_s)


def test_db_round_trip():
    [row] = rows_for([Spec("small", 300, 256, 60, savings={"route": (0, 1e-4)})])
    back = LedgerRow.from_db(row.to_db())
    assert back == row


def test_the_cache_stage_saving_and_bypass_conventions():
    ctx = context(Spec("small", 300, 0, 60, cache="semantic"), "r1", time.time())
    ctx.cache_saving = CacheSaving(by="semantic", tokens=360, usd=0.004, similarity=0.93)
    row = row_from_context(ctx, SMALL)
    assert row.saved_by == {"semantic": {"tokens": 360, "usd": 0.004}}      # the stage's figure wins
    ctx = context(Spec("small", 30, 0, 6), "r2", time.time())
    ctx.cache_bypass = "not deterministic"
    assert row_from_context(ctx, SMALL).cache == "bypass"

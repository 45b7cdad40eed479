from __future__ import annotations

import datetime as dt
import itertools
import logging

import pytest
from pydantic import ValidationError

from tests.helpers.synthetic import Spec, rows_for
from tokenomy.config import BudgetLimits
from tokenomy.ledger.ledger import Ledger
from tokenomy.limits.budget import BudgetExceeded, Budgets, period_bounds
from tokenomy.metrics.prometheus import Metrics

T0 = dt.datetime(2025, 3, 31, 22, 0, tzinfo=dt.UTC).timestamp()     # two hours before a day and month end


_ids = itertools.count()


def spend(model: str, prompt: int, completion: int, key: str = "k1", tenant: str = "acme", **kw) -> list:
    return rows_for([Spec(model, prompt, 0, completion, key_id=key, tenant=tenant, **kw)], now=T0,
                    prefix=f"req{next(_ids)}")


def test_periods_are_utc_days_and_months():
    assert period_bounds("day", T0) == (dt.datetime(2025, 3, 31, tzinfo=dt.UTC), dt.datetime(2025, 4, 1, tzinfo=dt.UTC))
    assert period_bounds("month", T0)[1] == dt.datetime(2025, 4, 1, tzinfo=dt.UTC)
    dec = dt.datetime(2025, 12, 15, tzinfo=dt.UTC).timestamp()
    assert period_bounds("month", dec) == (dt.datetime(2025, 12, 1, tzinfo=dt.UTC),
                                           dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with pytest.raises(ValueError):
        period_bounds("week", T0)


def test_usd_budget_refuses_with_which_budget_and_when_it_resets():
    clock = [T0]
    b = Budgets(keys={"k1": BudgetLimits(usd_per_day=0.0001)}, key_names={"k1": "alice"}, clock=lambda: clock[0])
    b.check("k1", "acme")
    [row] = spend("large", 100, 100)            # 100 * 0.2e-6 + 100 * 0.6e-6 = $0.00008
    b.record(row)
    b.check("k1", "acme")                       # $0.00008 < $0.0001
    b.record(row)
    assert b.used("key", "k1", "day") == (pytest.approx(0.00016), 400)
    with pytest.raises(BudgetExceeded) as exc:
        b.check("k1", "acme")
    e = exc.value
    assert e.status == 429 and e.code == "budget_exceeded" and e.type == "insufficient_quota"
    assert "daily USD budget of key 'alice'" in e.message
    assert "It resets at 2025-04-01T00:00:00Z" in e.message
    assert e.headers["retry-after"] == str(2 * 3600)
    b.check("k2", "acme")                       # other keys are not affected
    clock[0] += 2 * 3600 + 1                    # the next day: spend starts again
    b.check("k1", "acme")
    assert b.used("key", "k1", "day") == (0.0, 0)


def test_tenant_token_budget_counts_billed_tokens_only():
    clock = [T0]
    b = Budgets(tenants={"acme": BudgetLimits(tokens_per_month=1000)}, clock=lambda: clock[0])
    b.record(spend("small", 500, 100, key="a")[0])
    b.record(spend("small", 5000, 5000, key="b", cache="exact")[0])     # a cache hit bills nothing
    b.record(spend("small", 200, 100, key="c", tenant="other")[0])
    b.check("x", "acme")
    b.record(spend("small", 350, 50, key="b")[0])
    with pytest.raises(BudgetExceeded, match=r"monthly tokens budget of tenant 'acme' is 1,000 tokens "
                       r"\(1,000 tokens used, 0 tokens left\)"):
        b.check(None, "acme")
    b.check(None, "other")


def test_warning_threshold_logs_once_and_counts(caplog):
    m = Metrics()
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=1000, warn_at=0.5)}, metrics=m, clock=lambda: T0)
    caplog.set_level(logging.WARNING, logger="tokenomy.budget")
    b.record(spend("small", 300, 100)[0])
    assert not caplog.records
    b.record(spend("small", 100, 100)[0])       # 600 of 1000: over the 50% warning line
    b.record(spend("small", 10, 10)[0])
    warnings = [r for r in caplog.records if "budget warning" in r.getMessage()]
    assert len(warnings) == 1 and "60%" in warnings[0].getMessage()
    assert m.registry.get_sample_value("tokenomy_budget_warnings_total",
                                       {"scope": "key", "period": "day", "unit": "tokens"}) == 1
    assert m.registry.get_sample_value("tokenomy_budget_used_ratio",
                                       {"scope": "key", "id": "k1", "period": "day", "unit": "tokens"}) == 0.62
    b.check("k1", "acme")


def test_seeded_from_the_ledger(tmp_path):
    rows = spend("large", 1000, 1000, ago_s=60) + spend("large", 1000, 1000, ago_s=40 * 86400)
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        for r in rows:
            led.write(r)
        led.flush()
        b = Budgets(keys={"k1": BudgetLimits(usd_per_month=0.0005)}, clock=lambda: T0)
        b.seed(led)
    assert b.used("key", "k1", "month") == (pytest.approx(rows[0].cost_usd), 2000)   # last month's row left out
    with pytest.raises(BudgetExceeded, match="monthly USD"):
        b.check("k1", "acme")


def test_limits_are_validated():
    with pytest.raises(ValidationError):
        BudgetLimits(usd_per_day=-1)
    with pytest.raises(ValidationError):
        BudgetLimits(usd_per_week=1)
    assert not Budgets().enabled
    Budgets().check("k", "t")

"""Reserve, then settle (limits/budget.py): a request's worst case is held against every budget that applies until
its row replaces it, in one process and in Redis, with leases that free what a dead gateway held."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.helpers.admits import admits
from tests.helpers.synthetic import Spec, rows_for
from tests.helpers.wait import wait_until
from tokenomy.config import BudgetLimits
from tokenomy.limits.budget import BudgetExceeded, Budgets, WindowFull
from tokenomy.limits.shared_counters import SharedCounters


def row(rid: str, prompt: int, completion: int, key: str = "k1", tenant: str = "acme") -> object:
    [r] = rows_for([Spec("large", prompt, 0, completion, key_id=key, tenant=tenant)], now=time.time(), prefix="x")
    return dataclasses.replace(r, request_id=rid)


@pytest.fixture(params=["local", "redis"])
def make(request: pytest.FixtureRequest) -> Iterator[object]:
    """Budgets(keys=..., tenants=..., lease_s=...) in this process or on a real Redis (a fresh key space)."""
    shared = None
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        shared = SharedCounters(url, prefix=f"tokenomy:test:{uuid.uuid4().hex[:8]}:")

    def build(**kw: object) -> Budgets:
        return Budgets(shared=shared, **kw)  # type: ignore[arg-type]

    yield build


def test_concurrent_holds_never_add_up_past_the_budget(make) -> None:
    b = make(keys={"k1": BudgetLimits(tokens_per_day=100)}, key_names={"k1": "alice"})
    b.reserve("k1", "acme", "r1", 0.0, 60)
    with pytest.raises(BudgetExceeded) as exc:           # 60 held + 50 > 100, though nothing is spent yet
        b.reserve("k1", "acme", "r2", 0.0, 50)
    e = exc.value
    assert (e.status, e.code, e.unit, e.used, e.held, e.need, e.left) == (429, "budget_exceeded", "tokens", 0, 60, 50,
                                                                          40)
    assert "60 tokens held by requests in flight" in e.message and "40 tokens left" in e.message
    assert e.headers["retry-after"] == "1"               # it fits once the request in flight settles
    b.reserve("k1", "acme", "r3", 0.0, 40)               # exactly what is left
    assert b.held("key", "k1", "day") == (0.0, 100)
    b.record(row("r1", 20, 10))                          # r1 used 30 of its 60
    assert b.held("key", "k1", "day") == (0.0, 40) and b.used("key", "k1", "day")[1] == 30
    b.reserve("k1", "acme", "r2", 0.0, 30)               # 30 spent + 40 held + 30 = 100
    assert "r1" not in b.holding and b.holding["r2"].tokens == 30


def test_a_request_larger_than_the_budget_is_told_so(make) -> None:
    b = make(tenants={"acme": BudgetLimits(usd_per_month=0.01)})
    with pytest.raises(BudgetExceeded) as exc:
        b.reserve(None, "acme", "r1", 0.02, 10)
    e = exc.value
    assert e.scope == "tenant" and e.unit == "usd" and e.period == "month"
    assert "more than the whole budget" in e.message and int(e.headers["retry-after"]) > 1
    assert not b.holding                                 # refused: nothing held


def test_every_budget_that_applies_holds_or_none_does(make) -> None:
    b = make(keys={"k1": BudgetLimits(tokens_per_day=1000)}, tenants={"acme": BudgetLimits(tokens_per_day=100)})
    b.reserve("k1", "acme", "r1", 0.0, 90)
    with pytest.raises(BudgetExceeded) as exc:           # the key has room, the tenant does not
        b.reserve("k1", "acme", "r2", 0.0, 20)
    assert exc.value.scope == "tenant"
    assert b.held("key", "k1", "day") == (0.0, 90)        # the key did not keep r2's refused hold


def test_reservations_of_one_request_add_up_and_settle_together(make) -> None:
    b = make(keys={"k1": BudgetLimits(usd_per_day=1.0, tokens_per_day=1000)})
    b.reserve("k1", "acme", "r1", 0.25, 100)
    b.reserve("k1", "acme", "r1", 0.5, 0)                 # a dearer fallback holds the difference
    assert b.held("key", "k1", "day") == (pytest.approx(0.75), 100)
    with pytest.raises(BudgetExceeded):
        b.reserve("k1", "acme", "r2", 0.3, 10)
    b.record(row("r1", 10, 10))
    assert b.held("key", "k1", "day") == (0.0, 0)
    b.reserve("k1", "acme", "r2", 0.3, 10)


def test_a_refused_or_failed_request_releases_its_hold(make) -> None:
    b = make(keys={"k1": BudgetLimits(tokens_per_day=100)})
    b.reserve("k1", "acme", "r1", 0.0, 100)
    failed = dataclasses.replace(row("r1", 0, 0), status=502)   # nothing generated, nothing spent
    b.record(failed)
    assert b.held("key", "k1", "day") == (0.0, 0) and b.used("key", "k1", "day") == (0.0, 0)


def test_a_lapsed_lease_frees_the_hold_and_a_renewed_one_keeps_it() -> None:
    now = [0.0]
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}, lease_s=10, lease_clock=lambda: now[0])
    b.reserve("k1", "acme", "lost", 0.0, 50)
    del b.holding["lost"]                                # a request that ended without settling: nobody renews it
    b.reserve("k1", "acme", "alive", 0.0, 50)
    now[0] = 8
    b.renew()                                            # renews what this process's requests in flight hold
    now[0] = 12                                          # "lost" lapsed at 10; "alive" now holds until 18
    b.reserve("k1", "acme", "r3", 0.0, 50)
    with pytest.raises(BudgetExceeded):
        b.reserve("k1", "acme", "r4", 0.0, 1)


def test_a_lapsed_lease_in_redis_frees_the_hold(redis_url: str) -> None:
    shared = SharedCounters(redis_url, prefix=f"tokenomy:test:{uuid.uuid4().hex[:8]}:")
    dead = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}, shared=shared, lease_s=0.5)
    live = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}, shared=shared, lease_s=60)
    dead.reserve("k1", "acme", "d1", 0.0, 100)           # then its gateway dies: nothing renews or settles d1
    with pytest.raises(BudgetExceeded):
        live.reserve("k1", "acme", "l1", 0.0, 10)

    wait_until(admits(live, "k1", "acme", "l1", 0.0, 10), timeout=30, interval=0.1,
               what="the dead gateway's hold to lapse")
    assert live.held("key", "k1", "day") == (0.0, 10)


def test_in_redis_a_hold_far_from_the_limit_settles_after_the_answer_and_one_near_it_before(redis_url: str) -> None:
    shared = SharedCounters(redis_url, prefix=f"tokenomy:test:{uuid.uuid4().hex[:8]}:")
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}, shared=shared)
    try:
        # 20 held of 100: room for two more like it, so the settle is queued for the settler thread
        b.reserve("k1", "acme", "far", 0.0, 20)
        gate = threading.Event()            # the settler's first call waits here, so what follows queues behind
        shared.settle_tokens("nobody", "x", 0, 60.0, then=lambda _: gate.wait(30))
        try:
            b.record(row("far", 5, 3))                              # type: ignore[arg-type]
            assert "far" in b.settling and "far" in b.holding       # still held, until its settle has run
        finally:
            gate.set()
        assert shared.drain()
        assert not b.holding and not b.settling
        assert b.used("key", "k1", "day")[1] == 8 and b.held("key", "k1", "day") == (0.0, 0)
        # 40 held with 8 spent: no room for two more like it, so it settles before record returns
        b.reserve("k1", "acme", "near", 0.0, 40)
        b.record(row("near", 6, 4))                                  # type: ignore[arg-type]
        assert not b.holding and not b.settling
        assert b.used("key", "k1", "day")[1] == 18 and b.held("key", "k1", "day") == (0.0, 0)
    finally:
        shared.close()


def test_in_redis_a_tpm_window_held_with_the_budgets_is_all_or_nothing(redis_url: str) -> None:
    import redis

    prefix = f"tokenomy:test:{uuid.uuid4().hex[:8]}:"
    shared = SharedCounters(redis_url, prefix=prefix)
    r = redis.Redis.from_url(redis_url)
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}, shared=shared)
    window = ("k1", 30, 50, 60.0)               # 30 tokens in a 50-tokens-per-minute window

    def window_holds() -> dict[bytes, bytes]:
        return r.hgetall(f"{prefix}tpm:k1:holds")

    # both fit: both held in one step (no room for two more like it in the window: not ample)
    assert b.reserve("k1", "acme", "r1", 0.0, 30, window=window) is False
    assert window_holds() == {b"r1": b"0 30"} and b.held("key", "k1", "day") == (0.0, 30)
    # the window is full: refused with what it holds, and the budget holds nothing more
    with pytest.raises(WindowFull) as full:
        b.reserve("k1", "acme", "r2", 0.0, 30, window=window)
    assert full.value.used == 30 and b.held("key", "k1", "day") == (0.0, 30)
    # the budget is full: refused, and the window holds nothing more
    with pytest.raises(BudgetExceeded):
        b.reserve("k1", "acme", "r3", 0.0, 80, window=("k1", 10, 50, 60.0))
    assert window_holds() == {b"r1": b"0 30"}
    # without a shared store nothing is held with the budgets: the caller holds its window itself
    assert Budgets(keys={"k1": BudgetLimits(tokens_per_day=100)}).reserve("k1", "acme", "r4", 0.0, 5,
                                                                          window=window) is None

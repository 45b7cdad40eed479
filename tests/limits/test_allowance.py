"""Leased local allowances (limits/allowance.py): far from a limit a gateway holds a chunk of a budget in Redis and
admits requests against it with no round trip; near the limit it holds each request in Redis; two gateways never
spend past the budget between them; a killed holder's allowance comes free after lease_s; a store that stops
answering ends the allowances, so the store-down rule applies again."""

from __future__ import annotations

import dataclasses
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import services
from tests.helpers.admits import admits
from tests.helpers.synthetic import Spec, rows_for
from tests.helpers.wait import wait_until
from tokenomy.config import BudgetLimits
from tokenomy.errors import APIError
from tokenomy.limits.budget import BudgetExceeded, Budgets
from tokenomy.limits.shared_counters import SharedCounters


def row(rid: str, prompt: int, completion: int, key: str = "k1") -> Any:
    [r] = rows_for([Spec("large", prompt, 0, completion, key_id=key, tenant="acme")], now=time.time(), prefix="x")
    return dataclasses.replace(r, request_id=rid)


def counted(shared: SharedCounters) -> list[int]:
    """Every call this store makes to Redis, counted (a spy on the real client: it still runs)."""
    calls: list[int] = []
    call = shared._call

    def spy(fn: Any) -> Any:
        calls.append(1)
        return call(fn)

    shared._call = spy  # type: ignore[method-assign]
    return calls


def test_far_from_the_limit_requests_hold_and_settle_without_a_round_trip(redis_url: str) -> None:
    shared = SharedCounters(redis_url, prefix=f"tokenomy:test:{uuid.uuid4().hex[:8]}:")
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100_000)}, shared=shared)
    calls = counted(shared)
    try:
        # room for 5,000 requests of 20: the first takes an allowance of 256 such requests (the most one holds),
        # in the one round trip its reservation makes; the next 99 hold in it, here
        for i in range(100):
            b.reserve("k1", "acme", f"r{i}", 0.0, 20)
        assert len(calls) == 1
        assert b.held("key", "k1", "day") == (0.0, 256 * 20)
        for i in range(100):
            b.record(row(f"r{i}", 12, 3))           # each spends 15 of the 20 it held
        assert not b.holding
        # the keeper adds the spend to Redis's totals and lowers the allowance's hold by as much
        wait_until(lambda: b.used("key", "k1", "day")[1] == 1500, timeout=30, what="the spend to reach Redis")
        assert b.held("key", "k1", "day") == (0.0, 256 * 20 - 1500)
        b.close()                                   # given back: nothing held, the spend stays
        assert b.held("key", "k1", "day") == (0.0, 0) and b.used("key", "k1", "day")[1] == 1500
    finally:
        shared.close()


def test_near_the_limit_each_request_is_held_in_redis(redis_url: str) -> None:
    shared = SharedCounters(redis_url, prefix=f"tokenomy:test:{uuid.uuid4().hex[:8]}:")
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=600)}, shared=shared)
    calls = counted(shared)
    try:
        for i in range(3):                           # room for 30 requests of 20: fewer than an allowance needs
            b.reserve("k1", "acme", f"r{i}", 0.0, 20)
        assert len(calls) == 3 and b.held("key", "k1", "day") == (0.0, 60)
        assert b.allowances is not None and b.allowances.state() == {"open": 0, "kept": 0}
    finally:
        shared.close()


def test_two_gateways_sharing_a_budget_near_its_limit_never_overspend_it(redis_url: str) -> None:
    """Two gateways (each driven by one thread, as a gateway's event loop drives it) keep up to 8 requests in
    flight each against 2,000 tokens a day; a request holds 20 and spends 20, so the budget fits exactly 100. They
    start with allowances (room for 100 requests) and end holding each request in Redis."""
    prefix = f"tokenomy:test:{uuid.uuid4().hex[:8]}:"
    stores = [SharedCounters(redis_url, prefix=prefix) for _ in range(2)]
    gateways = [Budgets(keys={"k1": BudgetLimits(tokens_per_day=2000)}, shared=s) for s in stores]
    served = [0, 0]
    granted = [0, 0]
    start = threading.Barrier(2)

    def run(i: int) -> None:
        b, rng = gateways[i], random.Random(i)
        in_flight: list[str] = []
        start.wait(30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.001)       # the work of serving: without it one thread could spend the budget in one slice
            if in_flight and (len(in_flight) >= 8 or rng.random() < 0.4):
                rid = in_flight.pop(rng.randrange(len(in_flight)))
                b.record(row(rid, 15, 5))
                served[i] += 1
                continue
            rid = f"g{i}-{uuid.uuid4().hex[:8]}"
            try:
                b.reserve("k1", "acme", rid, 0.0, 20)
            except BudgetExceeded as e:
                if in_flight:
                    continue                        # settle one of ours, then try again
                if not e.fits_later:
                    return                          # nothing held anywhere could make room: the budget is spent
                time.sleep(0.02)                    # held elsewhere (the other's allowance or requests): poll
                continue
            assert b.allowances is not None
            granted[i] = max(granted[i], b.allowances.state()["kept"])
            in_flight.append(rid)
        raise AssertionError("still serving after 60 s")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    try:
        for b, s in zip(gateways, stores, strict=True):
            b.close()
            assert s.drain()
        used = gateways[0].used("key", "k1", "day")[1]
        assert used <= 2000                                           # overshoot 0
        assert used == 20 * sum(served) and sum(served) >= 99          # within one request of what it fits
        assert gateways[0].held("key", "k1", "day") == (0.0, 0)
        assert min(granted) >= 1                                        # both held an allowance on the way
    finally:
        for s in stores:
            s.close()


HOLDER = """
import sys, time
from tokenomy.config import BudgetLimits
from tokenomy.limits.budget import Budgets
from tokenomy.limits.shared_counters import SharedCounters
b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=10_000)}, shared=SharedCounters(sys.argv[1], prefix=sys.argv[2]),
            lease_s=2)
b.reserve("k1", "acme", "d1", 0.0, 100)      # room for 100 like it: an allowance of 12 (1,200 tokens), d1 in it
print("held", flush=True)
time.sleep(3600)
"""


def test_a_killed_holders_allowance_comes_free_after_its_lease(redis_url: str) -> None:
    prefix = f"tokenomy:test:{uuid.uuid4().hex[:8]}:"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, redis_url, prefix], stdout=subprocess.PIPE,
                              cwd=str(Path(__file__).resolve().parents[2]), text=True)
    shared = SharedCounters(redis_url, prefix=prefix)
    live = Budgets(keys={"k1": BudgetLimits(tokens_per_day=10_000)}, shared=shared, lease_s=60)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert live.held("key", "k1", "day") == (0.0, 1200)      # the holder's allowance, with d1 in flight in it
        holder.send_signal(signal.SIGKILL)                       # nothing renews its allowance or gives it back
        holder.wait()
        with pytest.raises(BudgetExceeded) as refused:
            live.reserve("k1", "acme", "l1", 0.0, 9000)
        assert refused.value.fits_later

        wait_until(admits(live, "k1", "acme", "l1", 0.0, 9000), timeout=30, interval=0.1,
                   what="the killed holder's allowance to lapse")
        assert live.held("key", "k1", "day") == (0.0, 9000)
    finally:
        holder.kill()
        shared.close()


def test_a_store_that_stops_answering_ends_the_allowances() -> None:
    server = services.start_redis()
    shared = SharedCounters(server.url, prefix="tokenomy:test:", retry_after_s=0.1)
    b = Budgets(keys={"k1": BudgetLimits(tokens_per_day=100_000)}, shared=shared)
    try:
        b.reserve("k1", "acme", "r1", 0.0, 20)
        b.reserve("k1", "acme", "r2", 0.0, 20)           # in the allowance
        server.stop()
        b.record(row("r1", 12, 3))                       # the keeper's flush fails: the allowances are dropped
        assert b.allowances is not None
        wait_until(lambda: b.allowances.state()["kept"] == 0, timeout=30, what="the allowances to be dropped")
        with pytest.raises(APIError) as down:            # budgets fail closed: a 503, as for any reservation
            b.reserve("k1", "acme", "r3", 0.0, 20)
        assert down.value.status == 503
        b.record(row("r2", 12, 3))                       # a request held in a dropped allowance still ends
        assert not b.holding
    finally:
        shared.close()
        server.stop()
